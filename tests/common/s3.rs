//! A real S3-compatible server in the test process: s3s's S3 service
//! (request parsing, SigV4 authentication with one access key) over
//! s3s-fs, which keeps buckets as directories of a temporary directory, on
//! a loopback port. Its runtime and directory go when it is dropped, also
//! when the test fails.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub const ACCESS_KEY: &str = "test-access-key";
pub const SECRET_KEY: &str = "test-secret-key-0123456789";
pub const BUCKET: &str = "code-runner-files";

pub struct S3Server {
    url: String,
    root: tempfile::TempDir,
    runtime: Option<tokio::runtime::Runtime>,
}

impl S3Server {
    /// Serves a directory holding one empty bucket, [`BUCKET`].
    pub fn start() -> Self {
        let root = tempfile::tempdir().expect("a directory for the bucket");
        std::fs::create_dir(root.path().join(BUCKET)).expect("the bucket");
        let fs = s3s_fs::FileSystem::new(root.path()).expect("s3s-fs on the directory");
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("s3-server")
            .enable_all()
            .build()
            .expect("a runtime for the S3 server");
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let connection = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
            }
        });
        Self {
            url,
            root,
            runtime: Some(runtime),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bucket's directory.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(BUCKET)
    }

    /// The objects in the bucket: each name (relative to the bucket) and
    /// its bytes, in name order.
    pub fn objects(&self) -> Vec<(String, Vec<u8>)> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, Vec<u8>)>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, base, out);
                } else {
                    let name = path
                        .strip_prefix(base)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    out.push((name, std::fs::read(&path).unwrap()));
                }
            }
        }
        let mut out = Vec::new();
        let dir = self.bucket_dir();
        walk(&dir, &dir, &mut out);
        out.sort();
        out
    }

    /// Stops serving: the endpoint refuses connections from now on.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// The settings of a daemon keeping its files' bytes here.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CODE_RUNNER_FILE_BACKEND", "s3".to_string()),
            ("CODE_RUNNER_S3_ENDPOINT", self.url.clone()),
            ("CODE_RUNNER_S3_BUCKET", BUCKET.to_string()),
            ("CODE_RUNNER_S3_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("CODE_RUNNER_S3_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
