//! Work done as the job's uid and gid ([`run_as`]): on a thread that has
//! dropped *its own* credentials to those ids for good (see
//! [`super::creds`]); the rest of the supervisor stays root, and no other
//! code ever runs with those credentials.
//!
//! One such thread, the job thread, is started with the supervisor
//! ([`start`]), before the bundle comes: idle, still root. The first work
//! given to it drops it to that work's ids (a warm runtime has it take its
//! job's ids at the prestart: [`take_ids`]), and from then on it takes work
//! for those ids only, one piece at a time, while its caller waits. Under
//! gVisor a new thread costs milliseconds (2.5–3.3 ms to start and join one,
//! measured in the python image on the development VM), and a job used to
//! start one for each of its files, a warm runtime's limits and the
//! linger wipe, on its path. Work for other ids (a graded job's runs), or
//! when the job thread is not there (it was not started, or work on it
//! panicked, or it could not take its ids), runs on a short-lived thread of
//! its own that ends with it, as all of it did before.

use std::sync::{Mutex, MutexGuard, mpsc};

use super::creds::drop_thread_to;
use super::{InitError, spawn_thread};

/// A piece of work, given whether the thread has the ids it asked for.
type Work = Box<dyn FnOnce(std::io::Result<()>) + Send>;

struct Request {
    uid: u32,
    gid: u32,
    work: Work,
}

struct JobThread {
    requests: mpsc::Sender<Request>,
    /// The ids it took with its first work.
    ids: Option<(u32, u32)>,
}

/// Where a job thread is kept: the supervisor's one is [`JOB_THREAD`].
pub(crate) struct Slot(Mutex<Option<JobThread>>);

static JOB_THREAD: Slot = Slot::new();

/// Starts the supervisor's job thread. Done once, early: when it is needed,
/// the pids cgroup may have no room left for a new thread.
pub(crate) fn start() -> Result<(), InitError> {
    JOB_THREAD.start()
}

/// Has the job thread take `uid`/`gid` now, ahead of the work that will
/// need them, if it has taken no ids yet (see [`Slot::take_ids`]).
pub(crate) fn take_ids(uid: u32, gid: u32) -> bool {
    JOB_THREAD.take_ids(uid, gid)
}

/// Runs `work` as `uid`/`gid` and returns what it returned: on the job
/// thread when it is there and free for those ids, else on a short-lived
/// thread called `name` (see the module docs).
pub(crate) fn run_as<T: Send + 'static>(
    name: &'static str,
    uid: u32,
    gid: u32,
    work: impl FnOnce() -> Result<T, InitError> + Send + 'static,
) -> Result<T, InitError> {
    JOB_THREAD.run_as(name, uid, gid, work)
}

impl Slot {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(None))
    }

    fn held(&self) -> MutexGuard<'_, Option<JobThread>> {
        // A panic while holding the lock leaves nothing half-done in it.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn start(&self) -> Result<(), InitError> {
        let (requests, incoming) = mpsc::channel::<Request>();
        spawn_thread("job-ids", move || serve(&incoming))?;
        *self.held() = Some(JobThread {
            requests,
            ids: None,
        });
        Ok(())
    }

    /// Has the job thread take `uid`/`gid` now, when it has taken no ids
    /// yet: the switch (two calls, and four that check it) is then done
    /// before the work that needs them comes. A warm runtime knows its
    /// job's ids at its prestart; under gVisor each of those calls costs
    /// tens of µs on the job's path otherwise. Whether the job thread has
    /// these ids afterwards (false when it has others, is not there, or
    /// could not take them).
    pub(crate) fn take_ids(&self, uid: u32, gid: u32) -> bool {
        match self.held().as_ref().map(|thread| thread.ids) {
            Some(None) => {}
            Some(Some(ids)) => return ids == (uid, gid),
            None => return false,
        }
        self.run_as("job-ids", uid, gid, || Ok(())).is_ok()
            && self
                .held()
                .as_ref()
                .is_some_and(|thread| thread.ids == Some((uid, gid)))
    }

    pub(crate) fn run_as<T: Send + 'static>(
        &self,
        name: &'static str,
        uid: u32,
        gid: u32,
        work: impl FnOnce() -> Result<T, InitError> + Send + 'static,
    ) -> Result<T, InitError> {
        let mut held = self.held();
        let Some(thread) = held
            .as_mut()
            .filter(|thread| thread.ids.is_none_or(|ids| ids == (uid, gid)))
        else {
            drop(held);
            return on_new_thread(name, uid, gid, work);
        };
        let (reply, outcome) = mpsc::channel();
        let request = Request {
            uid,
            gid,
            work: Box::new(move |dropped: std::io::Result<()>| {
                let _ = reply.send(match dropped {
                    Ok(()) => (true, work()),
                    Err(source) => (false, Err(InitError::SwitchIds { uid, gid, source })),
                });
            }),
        };
        thread.ids = Some((uid, gid));
        // The thread is idle in `serve` (the lock is held from one piece of
        // work to its reply, and a thread that ended was let go), so it
        // takes the request.
        let reply = match thread.requests.send(request) {
            Ok(()) => outcome.recv(),
            Err(_) => Err(mpsc::RecvError),
        };
        match reply {
            Ok((true, result)) => result,
            Ok((false, error)) => {
                // It could not take the ids and ends: let it go.
                *held = None;
                error
            }
            Err(mpsc::RecvError) => {
                // No reply: the work panicked, which ended the thread.
                *held = None;
                Err(panicked(name))
            }
        }
    }
}

fn serve(incoming: &mpsc::Receiver<Request>) {
    let Ok(first) = incoming.recv() else { return };
    let ids = (first.uid, first.gid);
    let dropped = drop_thread_to(first.uid, first.gid);
    let failed = dropped.is_err();
    (first.work)(dropped);
    if failed {
        // Its ids may be half changed: it serves nothing more.
        return;
    }
    while let Ok(request) = incoming.recv() {
        if (request.uid, request.gid) == ids {
            (request.work)(Ok(()));
        } else {
            // `run_as` never sends such work; refuse it rather than run it
            // with the wrong ids.
            (request.work)(Err(std::io::Error::other(
                "the job thread runs as other ids",
            )));
        }
    }
}

fn on_new_thread<T: Send + 'static>(
    name: &'static str,
    uid: u32,
    gid: u32,
    work: impl FnOnce() -> Result<T, InitError> + Send + 'static,
) -> Result<T, InitError> {
    let thread = spawn_thread(name, move || {
        drop_thread_to(uid, gid).map_err(|source| InitError::SwitchIds { uid, gid, source })?;
        work()
    })?;
    thread.join().unwrap_or_else(|_| Err(panicked(name)))
}

fn panicked(name: &'static str) -> InitError {
    InitError::ThreadPanicked { thread: name }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::{getgid, getuid};

    /// The name of the thread the work ran on, and its ids there.
    fn where_and_as(slot: &Slot, uid: u32) -> Result<(String, u32, u32), InitError> {
        slot.run_as("one-off", uid, uid, || {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            Ok((name, getuid().as_raw(), getgid().as_raw()))
        })
    }

    /// Whether the test runs as root, which taking other ids needs.
    fn as_root() -> bool {
        let root = getuid().is_root();
        if !root {
            eprintln!("skipped: needs root");
        }
        root
    }

    /// `result` is the refusal of uid 0 with gid `u32::MAX`.
    fn assert_refused(result: &Result<(), InitError>) {
        assert!(
            matches!(
                result,
                Err(InitError::SwitchIds {
                    uid: 0,
                    gid: u32::MAX,
                    ..
                })
            ),
            "{result:?}"
        );
    }

    fn test_uid(offset: u32) -> u32 {
        4_400_000 + (std::process::id() % 1000) * 10 + offset
    }

    #[test]
    fn work_for_the_first_ids_runs_on_the_job_thread_and_other_ids_on_threads_of_their_own() {
        if !as_root() {
            return;
        }
        let (job, other) = (test_uid(1), test_uid(2));
        let slot = Slot::new();
        slot.start().expect("start");
        let job_thread = ("job-ids".to_owned(), job, job);
        assert_eq!(where_and_as(&slot, job).expect("first"), job_thread);
        assert_eq!(
            where_and_as(&slot, other).expect("other ids"),
            ("one-off".to_owned(), other, other)
        );
        assert_eq!(where_and_as(&slot, job).expect("again"), job_thread);
        // The caller's thread never changed.
        assert!(getuid().is_root());
    }

    #[test]
    fn ids_taken_ahead_serve_the_work_for_them_and_no_other() {
        if !as_root() {
            return;
        }
        let (job, other) = (test_uid(6), test_uid(7));
        let slot = Slot::new();
        assert!(!slot.take_ids(job, job), "no job thread: nothing taken");
        slot.start().expect("start");
        assert!(slot.take_ids(job, job));
        assert!(slot.take_ids(job, job), "the same ids again: kept");
        assert!(!slot.take_ids(other, other), "other ids: not taken");
        assert_eq!(
            where_and_as(&slot, job).expect("the job's work"),
            ("job-ids".to_owned(), job, job)
        );
        assert_eq!(
            where_and_as(&slot, other).expect("other ids"),
            ("one-off".to_owned(), other, other)
        );
        // Ids it cannot take: refused, and the job thread is let go.
        let refused = Slot::new();
        refused.start().expect("start");
        assert!(!refused.take_ids(0, u32::MAX));
        assert_eq!(
            where_and_as(&refused, job).expect("after the refusal"),
            ("one-off".to_owned(), job, job)
        );
        assert!(getuid().is_root());
    }

    #[test]
    fn without_a_job_thread_work_runs_on_a_thread_of_its_own() {
        if !as_root() {
            return;
        }
        let uid = test_uid(3);
        let slot = Slot::new();
        assert_eq!(
            where_and_as(&slot, uid).expect("run"),
            ("one-off".to_owned(), uid, uid)
        );
    }

    #[test]
    fn a_panic_on_the_job_thread_is_an_error_and_later_work_still_runs() {
        if !as_root() {
            return;
        }
        let uid = test_uid(4);
        let slot = Slot::new();
        slot.start().expect("start");
        let panicked = slot.run_as("doomed", uid, uid, || -> Result<(), InitError> {
            panic!("work that panics")
        });
        assert!(
            matches!(
                panicked,
                Err(InitError::ThreadPanicked { thread: "doomed" })
            ),
            "{panicked:?}"
        );
        assert_eq!(
            where_and_as(&slot, uid).expect("after the panic"),
            ("one-off".to_owned(), uid, uid)
        );
    }

    #[test]
    fn ids_that_cannot_be_taken_are_an_error_and_end_the_job_thread() {
        if !as_root() {
            return;
        }
        let slot = Slot::new();
        slot.start().expect("start");
        // uid 0 with gid u32::MAX: setresgid(-1) leaves the gid, and the
        // check that the ids took effect fails.
        assert_refused(&slot.run_as("one-off", 0, u32::MAX, || Ok(())));
        // The same ids again: refused again, by a thread of their own.
        assert_refused(&slot.run_as("one-off", 0, u32::MAX, || Ok(())));
        let uid = test_uid(5);
        assert_eq!(
            where_and_as(&slot, uid).expect("after the refusal"),
            ("one-off".to_owned(), uid, uid)
        );
    }
}
