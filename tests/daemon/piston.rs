//! The Piston v2 API (`/api/v2/execute`) driven by the unmodified npm
//! package `piston-client` against a real `code-runner serve`, a real
//! redis-server and real sandboxes: each language family (interpreted and
//! compiled) with its arguments and stdin. The client is installed by
//! `scripts/compat-clients`. (Piston's shapes, errors, limits and the
//! connect protocol are tested without Docker in the `api` binary.)

use crate::common;

use common::compat::{piston_client, piston_settings};
use common::daemon::{Daemon, DaemonBuilder, Role, metric};
use common::redis_server::RedisServer;
use serde_json::{Value, json};

struct Piston {
    daemon: Daemon,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Piston {
    /// `serve` with keyless loopback Piston requests served as key `a`
    /// (`a` may have at most `max_active` jobs at once).
    async fn start(max_active: Option<u32>) -> Self {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let mut builder = DaemonBuilder::new(Role::Serve, &redis);
        for (name, value) in piston_settings(dir.path(), max_active) {
            builder = builder.env(name, value);
        }
        let daemon = builder.start().await;
        Self {
            daemon,
            _redis: redis,
            _dir: dir,
        }
    }

    fn execute(&self, language: &str, code: &str, config: Value) -> Value {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), code).unwrap();
        piston_client(
            &self.daemon.url,
            &[
                "execute",
                language,
                file.path().to_str().unwrap(),
                &config.to_string(),
            ],
        )
    }
}

#[tokio::test]
async fn execute_runs_each_language_family() {
    let piston = Piston::start(None).await;
    // (language as a Piston user names it, code, expected stdout, compiled)
    let cases = [
        (
            "python",
            "import sys\nprint('py', sys.argv[1:], repr(input()))",
            "py ['1', '2', '3'] 'ada'\n",
            false,
        ),
        (
            "javascript",
            "console.log('js', process.argv.slice(2).join(','))",
            "js 1,2,3\n",
            false,
        ),
        (
            "c++",
            "#include <iostream>\n#include <string>\nint main(int c, char** v){std::string s; std::cin >> s; std::cout << \"cpp \" << s << ' ' << c - 1 << std::endl;}",
            "cpp ada 3\n",
            true,
        ),
        (
            "java",
            "public class Hello {\n  public static void main(String[] a) {\n    System.out.println(\"java \" + a.length + \" \" + new java.util.Scanner(System.in).next());\n  }\n}\n",
            "java 3 ada\n",
            true,
        ),
        (
            "csharp",
            "class P { static void Main(string[] a) { System.Console.WriteLine(\"cs \" + a.Length + \" \" + System.Console.ReadLine()); } }",
            "cs 3 ada\n",
            true,
        ),
        (
            "rust",
            "fn main() { let mut s = String::new(); std::io::stdin().read_line(&mut s).unwrap(); println!(\"rs {} {}\", std::env::args().count() - 1, s.trim()); }",
            "rs 3 ada\n",
            true,
        ),
        (
            "haskell",
            "main :: IO ()\nmain = getLine >>= \\s -> putStrLn (\"hs \" ++ s)\n",
            "hs ada\n",
            true,
        ),
    ];
    for (language, code, expected, compiled) in cases {
        let answer = piston.execute(
            language,
            code,
            // Room for a JVM's start on a loaded machine: Piston's default
            // run timeout (3 s) is not what this test is about.
            json!({"stdin": "ada", "compileTimeout": 60000, "runTimeout": 20000}),
        );
        assert_eq!(answer["run"]["stdout"], expected, "{language}: {answer:#}");
        assert_eq!(answer["run"]["code"], 0, "{language}: {answer:#}");
        assert_eq!(answer["run"]["signal"], Value::Null);
        assert_eq!(answer["run"]["status"], Value::Null);
        assert_eq!(answer["run"]["output"], expected, "{language}");
        assert!(answer["run"]["wall_time"].as_u64().is_some(), "{answer:#}");
        assert_eq!(
            answer["compile"].is_object(),
            compiled,
            "{language}: {answer:#}"
        );
        if compiled {
            assert_eq!(answer["compile"]["code"], 0, "{language}: {answer:#}");
        }
        let name = answer["language"].as_str().unwrap();
        assert_eq!(name, language, "{answer:#}");
    }
    // Ordinary jobs: counted like any other.
    let metrics = piston.daemon.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "code_runner_jobs_total{language=\"python\",status=\"succeeded\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "code_runner_jobs_total{language=\"java\",status=\"succeeded\"}"
        ),
        Some(1.0)
    );
}
