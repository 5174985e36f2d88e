//! A TCP proxy between a daemon and its redis-server, on loopback, that a
//! test can cut (every connection closed, new ones refused: the daemon's
//! Redis is unreachable while the Redis itself lives on) and restore, and
//! that can lose the reply to one `BLMOVE` (the command runs on the server,
//! its answer never reaches the client: the connection drops instead).
//! It can also pause (nothing goes either way, the connections stay
//! open: the daemon hears nothing, as when it is stopped with SIGSTOP)
//! and resume.
//!
//! It runs on a thread of its own with its own tokio runtime, and stops
//! when dropped (also when the test fails).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

struct Shared {
    /// While set: connections are closed and new ones refused.
    cut: AtomicBool,
    /// Bumped by every cut: connections of an older generation close.
    generation: AtomicUsize,
    /// Lose the reply to the next `BLMOVE` that moves a job.
    lose_blmove_reply: AtomicBool,
    /// Replies to `BLMOVE` lost so far.
    lost_replies: AtomicUsize,
    /// While set: nothing is relayed either way.
    paused: AtomicBool,
    stop: CancellationToken,
}

pub struct RedisProxy {
    pub port: u16,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RedisProxy {
    /// A proxy on a free loopback port to the redis-server on `target_port`.
    pub fn start(target_port: u16) -> Self {
        let shared = Arc::new(Shared {
            cut: AtomicBool::new(false),
            generation: AtomicUsize::new(0),
            lose_blmove_reply: AtomicBool::new(false),
            lost_replies: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            stop: CancellationToken::new(),
        });
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port for the proxy");
        std_listener.set_nonblocking(true).expect("non-blocking");
        let port = std_listener.local_addr().expect("an address").port();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the proxy");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("the proxy listens");
                loop {
                    let accepted = tokio::select! {
                        () = thread_shared.stop.cancelled() => return,
                        accepted = listener.accept() => accepted,
                    };
                    let Ok((client, _)) = accepted else { continue };
                    if thread_shared.cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    tokio::spawn(relay(client, target_port, Arc::clone(&thread_shared)));
                }
            });
        });
        Self {
            port,
            shared,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Cuts every connection and refuses new ones until [`Self::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// The reply to the next `BLMOVE` that moves a job is lost.
    pub fn lose_next_blmove_reply(&self) {
        self.shared.lose_blmove_reply.store(true, Ordering::SeqCst);
    }

    pub fn lost_replies(&self) -> usize {
        self.shared.lost_replies.load(Ordering::SeqCst)
    }

    /// Relays nothing either way until [`Self::resume`]; the connections
    /// stay open and what is sent meanwhile waits (as for a process that
    /// was stopped).
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
        self.cut();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Relays one connection both ways until either side closes, the proxy is
/// cut, or a `BLMOVE` reply is to be lost.
async fn relay(client: TcpStream, target_port: u16, shared: Arc<Shared>) {
    let generation = shared.generation.load(Ordering::SeqCst);
    let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let blmove_sent = Arc::new(AtomicBool::new(false));
    let cut = {
        let shared = Arc::clone(&shared);
        async move {
            while shared.generation.load(Ordering::SeqCst) == generation
                && !shared.stop.is_cancelled()
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    let upstream = {
        let blmove_sent = Arc::clone(&blmove_sent);
        let shared = Arc::clone(&shared);
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buffer[..n];
                if chunk.windows(6).any(|w| w.eq_ignore_ascii_case(b"BLMOVE")) {
                    blmove_sent.store(true, Ordering::SeqCst);
                }
                while_paused(&shared).await;
                if server_write.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    let downstream = {
        let shared = Arc::clone(&shared);
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match server_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buffer[..n];
                // A BLMOVE that moved a job answers with a bulk string
                // (`$36\r\n<id>`); a timeout answers with a null.
                if blmove_sent.load(Ordering::SeqCst)
                    && chunk.first() == Some(&b'$')
                    && !chunk.starts_with(b"$-1")
                    && shared
                        .lose_blmove_reply
                        .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    shared.lost_replies.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                while_paused(&shared).await;
                if client_write.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = cut => {}
        () = upstream => {}
        () = downstream => {}
    }
}

/// Waits while the proxy is paused.
async fn while_paused(shared: &Shared) {
    while shared.paused.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
