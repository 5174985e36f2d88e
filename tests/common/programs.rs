//! Programs in every language, as `(language, file name, source)`: shared by
//! the sandbox and the daemon tests.

/// Per language: a program that prints `hello from <language>`.
pub const HELLO: &[(&str, &str, &str)] = &[
    ("python", "main.py", "print('hello from python')"),
    (
        "javascript",
        "main.js",
        "console.log('hello from javascript')",
    ),
    (
        "c",
        "main.c",
        "#include <stdio.h>\nint main(void){puts(\"hello from c\");return 0;}",
    ),
    (
        "cpp",
        "main.cpp",
        "#include <iostream>\nint main(){std::cout<<\"hello from cpp\"<<std::endl;}",
    ),
    ("bash", "main.sh", "echo hello from bash"),
    ("ruby", "main.rb", "puts 'hello from ruby'"),
    (
        "go",
        "main.go",
        "package main\nimport \"fmt\"\nfunc main(){fmt.Println(\"hello from go\")}",
    ),
];

/// Per language: a program that copies stdin to stdout byte for byte.
pub const ECHO: &[(&str, &str, &str)] = &[
    (
        "python",
        "main.py",
        "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())",
    ),
    (
        "javascript",
        "main.js",
        "const c=[];process.stdin.on('data',d=>c.push(d));process.stdin.on('end',()=>process.stdout.write(Buffer.concat(c)));",
    ),
    (
        "c",
        "main.c",
        "#include <stdio.h>\nint main(void){int ch;while((ch=getchar())!=EOF)putchar(ch);return 0;}",
    ),
    (
        "cpp",
        "main.cpp",
        "#include <iostream>\nint main(){char c;std::cin>>std::noskipws;while(std::cin.get(c))std::cout.put(c);}",
    ),
    ("bash", "main.sh", "cat"),
    (
        "ruby",
        "main.rb",
        "STDOUT.binmode; STDIN.binmode; STDOUT.write(STDIN.read)",
    ),
    (
        "go",
        "main.go",
        "package main\nimport (\"io\";\"os\")\nfunc main(){io.Copy(os.Stdout, os.Stdin)}",
    ),
];

/// What a program must end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exits with this code.
    Exit(i32),
    /// A signal of this name ends it.
    Signal(&'static str),
}

/// The tests of one language (`tests/sandbox/languages.rs`): every language of the
/// catalog has one, and every case is checked under runc and runsc.
pub struct LanguageCase {
    pub language: &'static str,
    /// The entry file's name.
    pub file: &'static str,
    /// Prints `hello from <language>` and a newline.
    pub hello: &'static str,
    /// Reads stdin: the program, the input, and the exact stdout expected.
    pub stdin: (&'static str, &'static str, &'static str),
    /// Compiled languages: a program that does not compile, and a piece of
    /// the compiler's diagnostics.
    pub compile_error: Option<(&'static str, &'static str)>,
    /// A program that fails at run time, and how it must end.
    pub runtime_error: (&'static str, Ending),
}

/// The input of the stdin cases that echo byte for byte: a newline in the
/// middle, UTF-8, no newline at the end.
pub const ECHO_INPUT: &str = "first line\nsecond ünïcode line, no newline at the end";

pub const LANGUAGE_CASES: &[LanguageCase] = &[
    LanguageCase {
        language: "python",
        file: "main.py",
        hello: "print('hello from python')",
        stdin: (
            "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: None,
        runtime_error: ("print(1 // 0)", Ending::Exit(1)),
    },
    LanguageCase {
        language: "javascript",
        file: "main.js",
        hello: "console.log('hello from javascript')",
        stdin: (
            "const c=[];process.stdin.on('data',d=>c.push(d));process.stdin.on('end',()=>process.stdout.write(Buffer.concat(c)));",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: None,
        runtime_error: ("throw new Error('boom')", Ending::Exit(1)),
    },
    LanguageCase {
        language: "c",
        file: "main.c",
        hello: "#include <stdio.h>\nint main(void){puts(\"hello from c\");return 0;}",
        stdin: (
            "#include <stdio.h>\nint main(void){int ch;while((ch=getchar())!=EOF)putchar(ch);return 0;}",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some(("int main(void){ return nope; }", "nope’ undeclared")),
        runtime_error: (
            "int main(void){ volatile int *p = 0; return *p; }",
            Ending::Signal("SIGSEGV"),
        ),
    },
    LanguageCase {
        language: "cpp",
        file: "main.cpp",
        hello: "#include <iostream>\nint main(){std::cout<<\"hello from cpp\"<<std::endl;}",
        stdin: (
            "#include <iostream>\nint main(){char c;std::cin>>std::noskipws;while(std::cin.get(c))std::cout.put(c);}",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some(("int main(){ return nope; }", "nope’ was not declared")),
        runtime_error: (
            "#include <stdexcept>\nint main(){ throw std::runtime_error(\"boom\"); }",
            Ending::Signal("SIGABRT"),
        ),
    },
    LanguageCase {
        language: "bash",
        file: "main.sh",
        hello: "echo hello from bash",
        stdin: ("cat", ECHO_INPUT, ECHO_INPUT),
        compile_error: None,
        runtime_error: ("no_such_command_here", Ending::Exit(127)),
    },
    LanguageCase {
        language: "ruby",
        file: "main.rb",
        hello: "puts 'hello from ruby'",
        stdin: (
            "STDOUT.binmode; STDIN.binmode; STDOUT.write(STDIN.read)",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: None,
        runtime_error: ("raise 'boom'", Ending::Exit(1)),
    },
    LanguageCase {
        language: "go",
        file: "main.go",
        hello: "package main\nimport \"fmt\"\nfunc main(){fmt.Println(\"hello from go\")}",
        stdin: (
            "package main\nimport (\"io\";\"os\")\nfunc main(){io.Copy(os.Stdout, os.Stdin)}",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some(("package main\nfunc main(){ nope() }", "undefined: nope")),
        runtime_error: (
            "package main\nfunc main(){ panic(\"boom\") }",
            Ending::Exit(2),
        ),
    },
    LanguageCase {
        language: "java",
        file: "Main.java",
        hello: "public class Main {\n  public static void main(String[] args) {\n    System.out.println(\"hello from java\");\n  }\n}\n",
        stdin: (
            "public class Main {\n  public static void main(String[] args) throws Exception {\n    System.in.transferTo(System.out);\n    System.out.flush();\n  }\n}\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "public class Main {\n  public static void main(String[] args) { nope(); }\n}\n",
            "cannot find symbol",
        )),
        runtime_error: (
            "public class Main {\n  public static void main(String[] args) { throw new RuntimeException(\"boom\"); }\n}\n",
            Ending::Exit(1),
        ),
    },
    LanguageCase {
        language: "kotlin",
        file: "main.kt",
        hello: "fun main() {\n    println(\"hello from kotlin\")\n}\n",
        stdin: (
            "fun main() {\n    System.`in`.copyTo(System.out)\n    System.out.flush()\n}\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "fun main() {\n    nope()\n}\n",
            "unresolved reference: nope",
        )),
        runtime_error: (
            "fun main() {\n    throw RuntimeException(\"boom\")\n}\n",
            Ending::Exit(1),
        ),
    },
    LanguageCase {
        language: "csharp",
        file: "main.cs",
        hello: "class Program {\n  static void Main() { System.Console.WriteLine(\"hello from csharp\"); }\n}\n",
        stdin: (
            "class Program {\n  static void Main() {\n    var input = System.Console.OpenStandardInput();\n    var output = System.Console.OpenStandardOutput();\n    input.CopyTo(output);\n    output.Flush();\n  }\n}\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "class Program {\n  static void Main() { nope(); }\n}\n",
            "error CS0103",
        )),
        runtime_error: (
            "class Program {\n  static void Main() { throw new System.Exception(\"boom\"); }\n}\n",
            Ending::Exit(1),
        ),
    },
    LanguageCase {
        language: "typescript",
        file: "main.ts",
        hello: "const greeting: string = 'hello from typescript';\nconsole.log(greeting);\n",
        stdin: (
            "const data: string = require('fs').readFileSync(0, 'utf8');\nprocess.stdout.write(data);\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "const n: number = 'not a number';\nconsole.log(n);\n",
            "error TS2322",
        )),
        runtime_error: ("throw new Error('boom');\n", Ending::Exit(1)),
    },
    LanguageCase {
        language: "rust",
        file: "main.rs",
        hello: "fn main() {\n    println!(\"hello from rust\");\n}\n",
        stdin: (
            "use std::io::Read;\nfn main() {\n    let mut data = Vec::new();\n    std::io::stdin().read_to_end(&mut data).unwrap();\n    std::io::Write::write_all(&mut std::io::stdout(), &data).unwrap();\n}\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "fn main() {\n    nope();\n}\n",
            "cannot find function `nope`",
        )),
        runtime_error: ("fn main() {\n    panic!(\"boom\");\n}\n", Ending::Exit(101)),
    },
    LanguageCase {
        language: "php",
        file: "main.php",
        hello: "<?php\necho \"hello from php\\n\";\n",
        stdin: (
            "<?php\necho stream_get_contents(STDIN);\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: None,
        runtime_error: ("<?php\nthrow new Exception('boom');\n", Ending::Exit(255)),
    },
    LanguageCase {
        language: "perl",
        file: "main.pl",
        hello: "print \"hello from perl\\n\";\n",
        stdin: (
            "binmode STDIN; binmode STDOUT; local $/; print <STDIN>;\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: None,
        runtime_error: ("$! = 0; $? = 0; die \"boom\\n\";\n", Ending::Exit(255)),
    },
    LanguageCase {
        language: "lua",
        file: "main.lua",
        hello: "print('hello from lua')\n",
        stdin: ("io.write(io.read('a'))\n", ECHO_INPUT, ECHO_INPUT),
        compile_error: None,
        runtime_error: ("error('boom')\n", Ending::Exit(1)),
    },
    LanguageCase {
        language: "haskell",
        file: "main.hs",
        hello: "main :: IO ()\nmain = putStrLn \"hello from haskell\"\n",
        stdin: (
            "import qualified Data.ByteString as B\nmain :: IO ()\nmain = B.getContents >>= B.putStr\n",
            ECHO_INPUT,
            ECHO_INPUT,
        ),
        compile_error: Some((
            "main :: IO ()\nmain = nope\n",
            "Variable not in scope: nope",
        )),
        runtime_error: ("main :: IO ()\nmain = error \"boom\"\n", Ending::Exit(1)),
    },
    LanguageCase {
        language: "r",
        file: "main.r",
        hello: "cat('hello from r\\n')\n",
        stdin: (
            "lines <- readLines(file('stdin'))\ncat(paste0('read: ', lines), sep = '\\n')\n",
            "first\nsecond ünïcode\n",
            "read: first\nread: second ünïcode\n",
        ),
        compile_error: None,
        runtime_error: ("stop('boom')\n", Ending::Exit(1)),
    },
    LanguageCase {
        language: "sql",
        file: "main.sql",
        hello: "SELECT 'hello from sql';\n",
        stdin: (
            "CREATE TABLE input(line TEXT);\n.import '|cat' input\nSELECT upper(line) FROM input;\n",
            "shout ünïcode\nsecond",
            "SHOUT üNïCODE\nSECOND\n",
        ),
        compile_error: None,
        runtime_error: ("SELECT * FROM no_such_table;\n", Ending::Exit(1)),
    },
    LanguageCase {
        language: "pascal",
        file: "main.pas",
        hello: "program main;\nbegin\n  writeln('hello from pascal');\nend.\n",
        stdin: (
            "program main;\nvar line: string;\nbegin\n  while not eof do\n  begin\n    readln(line);\n    writeln('read: ', line);\n  end;\nend.\n",
            "first\nsecond ünïcode\n",
            "read: first\nread: second ünïcode\n",
        ),
        compile_error: Some((
            "program main;\nbegin\n  nope;\nend.\n",
            "Identifier not found \"nope\"",
        )),
        runtime_error: (
            "program main;\nvar a, b: integer;\nbegin\n  a := 1;\n  b := 0;\n  writeln(a div b);\nend.\n",
            Ending::Exit(200),
        ),
    },
    LanguageCase {
        language: "fortran",
        file: "main.f90",
        hello: "program main\n  print '(a)', 'hello from fortran'\nend program main\n",
        stdin: (
            "program main\n  implicit none\n  character(len=200) :: line\n  integer :: ios\n  do\n    read (*, '(a)', iostat=ios) line\n    if (ios /= 0) exit\n    print '(a)', 'read: ' // trim(line)\n  end do\nend program main\n",
            "first\nsecond line\n",
            "read: first\nread: second line\n",
        ),
        compile_error: Some((
            "program main\n  implicit none\n  x = 1\nend program main\n",
            "has no IMPLICIT type",
        )),
        runtime_error: (
            "program main\n  error stop 3\nend program main\n",
            Ending::Exit(3),
        ),
    },
];
