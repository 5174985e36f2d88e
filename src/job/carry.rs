//! Prepared jobs handed from the API to the worker of the same process
//! (`code-runner serve`), so a job is parsed and validated once: the API
//! leaves what [`super::prepare`] made here at submit, and the worker that
//! claims the job takes it instead of reading the spec back from Redis and
//! preparing it again. A job claimed by another process is prepared there
//! from its spec, as before.
//!
//! Bounded: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] of their files and
//! stdin; the oldest go first, and one older than [`MAX_AGE`] (queued that
//! long, or claimed elsewhere) is dropped on the next insert, as are the
//! ids of jobs already taken at the front of the insertion order.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::PreparedJob;

pub const MAX_JOBS: usize = 10_000;
pub const MAX_BYTES: usize = 64 << 20;
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// See the module documentation; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct CarriedJobs {
    inner: Arc<Mutex<Carried>>,
}

#[derive(Debug, Default)]
struct Carried {
    jobs: HashMap<String, (PreparedJob, usize)>,
    /// Ids by insertion, with when.
    order: VecDeque<(String, Instant)>,
    bytes: usize,
}

fn size(job: &PreparedJob) -> usize {
    job.stdin.len()
        + job
            .bundle
            .files
            .iter()
            .map(|f| f.content.len())
            .sum::<usize>()
}

impl CarriedJobs {
    /// Keeps `job` for the worker that claims `id` (too big a job is not kept).
    pub fn insert(&self, id: &str, job: PreparedJob) {
        let bytes = size(&job);
        if bytes > MAX_BYTES {
            return;
        }
        let mut carried = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        while let Some((oldest, at)) = carried.order.front().cloned() {
            let full = carried.jobs.len() >= MAX_JOBS || carried.bytes + bytes > MAX_BYTES;
            // A job taken leaves its id here; most are taken in the order
            // they came, so these go at the next insert instead of staying
            // for MAX_AGE (60 000 ids at 100 jobs a second).
            let taken = !carried.jobs.contains_key(&oldest);
            if !full && !taken && now.duration_since(at) < MAX_AGE {
                break;
            }
            carried.order.pop_front();
            if let Some((_, size)) = carried.jobs.remove(&oldest) {
                carried.bytes -= size;
            }
        }
        carried.bytes += bytes;
        carried.order.push_back((id.to_string(), now));
        if let Some((_, size)) = carried.jobs.insert(id.to_string(), (job, bytes)) {
            carried.bytes -= size;
        }
    }

    /// The prepared job of `id`, if this process submitted it.
    pub fn take(&self, id: &str) -> Option<PreparedJob> {
        let mut carried = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (job, bytes) = carried.jobs.remove(id)?;
        carried.bytes -= bytes;
        // Its place in `order` goes once it reaches the front.
        Some(job)
    }

    /// Jobs held now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .jobs
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids held in the insertion order (taken ones not yet dropped).
    #[cfg(test)]
    fn ids_held(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .order
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::limits::LimitPolicy;
    use crate::job::{FileSpec, JobSpec, prepare};
    use crate::languages::LanguageCatalog;

    fn job(content_bytes: usize) -> PreparedJob {
        let spec = JobSpec {
            language: "python".into(),
            files: vec![FileSpec {
                name: "main.py".into(),
                content: "x".repeat(content_bytes),
                reference: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut policy = LimitPolicy::default();
        policy.maximum.files_bytes = 128 << 20;
        policy.defaults.files_bytes = 128 << 20;
        prepare(&spec, &LanguageCatalog::embedded().unwrap(), &policy).unwrap()
    }

    #[test]
    fn a_job_is_taken_once() {
        let carried = CarriedJobs::default();
        carried.insert("a", job(10));
        assert_eq!(carried.len(), 1);
        let taken = carried.take("a").unwrap();
        assert_eq!(taken.bundle.files[0].content.len(), 10);
        assert!(carried.take("a").is_none());
        assert!(carried.is_empty());
    }

    #[test]
    fn the_ids_of_taken_jobs_go_at_the_next_insert() {
        let carried = CarriedJobs::default();
        for id in ["a", "b", "c", "d"] {
            carried.insert(id, job(1));
        }
        // "c" is taken before "b": its id stays behind b's until b goes.
        for id in ["a", "c"] {
            assert!(carried.take(id).is_some());
        }
        carried.insert("e", job(1));
        assert_eq!(carried.ids_held(), 4, "b, c's id, d and e");
        assert!(carried.take("b").is_some());
        carried.insert("f", job(1));
        assert_eq!(carried.ids_held(), 3, "d, e and f");
        for id in ["d", "e", "f"] {
            assert!(carried.take(id).is_some());
        }
    }

    #[test]
    fn the_oldest_go_when_the_bytes_run_out() {
        let carried = CarriedJobs::default();
        let third = MAX_BYTES / 3 + 1;
        carried.insert("a", job(third));
        carried.insert("b", job(third));
        carried.insert("c", job(third));
        assert!(carried.take("a").is_none(), "the oldest made room");
        assert!(carried.take("b").is_some());
        assert!(carried.take("c").is_some());
        carried.insert("huge", job(MAX_BYTES + 1));
        assert!(carried.take("huge").is_none());
    }
}
