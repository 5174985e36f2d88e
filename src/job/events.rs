//! The events of a job, as its stream carries them (`job:<id>:events`) and as
//! WebSocket and SSE clients receive them (docs/api.md, "Streams"):
//!
//! ```json
//! {"seq":1,"type":"status","status":"queued"}
//! {"seq":2,"type":"status","status":"running","worker":"vm-1a2b"}
//! {"seq":3,"type":"stage","stage":"run","state":"start"}
//! {"seq":4,"type":"stdout","data":"hello\n"}
//! {"seq":5,"type":"stderr","data":"//4=","encoding":"base64"}
//! {"seq":6,"type":"stage","stage":"run","state":"end","exit_code":0,"reason":"exited",…}
//! {"seq":7,"type":"exit","status":"succeeded","result":{…}}
//! ```
//!
//! `seq` numbers a job's events from 1 without gaps; it is the stream entry's
//! id, so a client resumes after the last `seq` it saw. `exit` is the last
//! event, with one exception: a platform verdict (`worker_lost`,
//! `deadline_exceeded`) can be followed, within the late-result window, by
//! one more `exit` carrying `"replaces": <seq>` when the lost attempt's
//! worker delivers its real result after all. A batch job whose worker was
//! lost mid-run and that runs again gets an `attempt` event
//! (`{"type":"attempt","attempt":2,"reason":"worker_lost"}`): what came
//! before it belongs to the lost attempt. Output that is not UTF-8 is base64 with `"encoding":"base64"`.
//! An `error` event (`{"type":"error","message":…}`, no `seq`) is sent to
//! one connection only, about that connection (a bad frame), and never stored.

use serde::{Deserialize, Serialize};

use super::result::{Encoding, JobResult, Output, StageResult, Status};
use crate::protocol::Reason;

/// The read buffer of each end of a job's WebSocket (the API's and the
/// client's). tungstenite's default is 128 KiB per connection, and it
/// zero-fills up to that much before every read: about 37 MiB of buffers
/// for 300 sessions, and a `memset` per read (0.2 % of the machine's
/// samples in the 300-student burst, `perf record -a`). A larger message
/// still reads whole; it takes more reads.
pub const WS_READ_BUFFER_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageState {
    Start,
    End,
}

fn is_utf8(encoding: &Encoding) -> bool {
    *encoding == Encoding::Utf8
}

/// One event of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobEvent {
    Status {
        status: Status,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
    },
    Stage {
        stage: String,
        state: StageState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Reason>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wall_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_peak_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
        /// At a stage's end, where it is known (see [`StageResult`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pids_limit_reached: Option<bool>,
    },
    Stdout {
        data: String,
        #[serde(default, skip_serializing_if = "is_utf8")]
        encoding: Encoding,
    },
    Stderr {
        data: String,
        #[serde(default, skip_serializing_if = "is_utf8")]
        encoding: Encoding,
    },
    /// A graded job's test: `start`, then `end` with its verdict and
    /// figures (the fields of a test's result).
    Test {
        index: usize,
        name: String,
        state: StageState,
        #[serde(flatten)]
        outcome: Option<Box<super::grading::TestOutcome>>,
    },
    /// The job's previous attempt was lost with its worker and the job
    /// runs again: what a follower showed of its output is void.
    Attempt {
        attempt: u32,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
    },
    Exit {
        status: Status,
        /// The `seq` of an earlier `exit` this one replaces: the platform's
        /// verdict (`worker_lost`, `deadline_exceeded`) on an attempt whose
        /// worker then delivered its real result.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<u64>,
        result: Box<JobResult>,
    },
    Error {
        message: String,
    },
    /// A process of the job waits for its stdin and nothing is buffered for
    /// it (interactive jobs): once per wait, after the output written
    /// before it. The next output or input ends the wait.
    InputWanted,
    /// A connection of a job with network through its egress proxy, when
    /// it ended: `host`, `port`, `address` (connected to, or the forbidden
    /// one), `allowed`, `reason` (why refused or cut short), `bytes_up`,
    /// `bytes_down` (docs/egress.md).
    Egress(crate::egress::EgressEvent),
}

impl JobEvent {
    pub fn stdout(bytes: Vec<u8>) -> Self {
        let (data, encoding) = Output(bytes).encoded();
        JobEvent::Stdout { data, encoding }
    }

    pub fn stderr(bytes: Vec<u8>) -> Self {
        let (data, encoding) = Output(bytes).encoded();
        JobEvent::Stderr { data, encoding }
    }

    pub fn stage_start(stage: &str) -> Self {
        JobEvent::Stage {
            stage: stage.to_string(),
            state: StageState::Start,
            exit_code: None,
            signal: None,
            reason: None,
            wall_ms: None,
            cpu_ms: None,
            memory_peak_bytes: None,
            truncated: None,
            pids_limit_reached: None,
        }
    }

    /// The end of a stage, without its output (that went out as it came).
    pub fn stage_end(stage: &str, result: &StageResult) -> Self {
        JobEvent::Stage {
            stage: stage.to_string(),
            state: StageState::End,
            exit_code: result.exit_code,
            signal: result.signal.clone(),
            reason: Some(result.reason),
            wall_ms: Some(result.wall_ms),
            cpu_ms: Some(result.cpu_ms),
            memory_peak_bytes: Some(result.memory_peak_bytes),
            truncated: Some(result.truncated),
            pids_limit_reached: result.pids_limit_reached,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        JobEvent::Error {
            message: message.into(),
        }
    }

    /// The event as JSON (without `seq`).
    pub fn to_json(&self) -> String {
        // Serializing these types cannot fail: string keys, no custom
        // serializers that error.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The bytes of an output event, decoded.
    pub fn output_bytes(&self) -> Option<Vec<u8>> {
        match self {
            JobEvent::Stdout { data, encoding } | JobEvent::Stderr { data, encoding } => {
                Output::decode(data, *encoding).ok().map(|o| o.0)
            }
            _ => None,
        }
    }
}

/// An event as stored: its `seq` and its JSON (an object without `seq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub json: String,
}

impl StoredEvent {
    /// Whether this is the job's `exit` event (the last one). Every event
    /// JSON starts with its `type`.
    pub fn is_exit(&self) -> bool {
        self.json.starts_with(r#"{"type":"exit""#)
    }

    /// Whether this is the `status` event of the job's start (`running`):
    /// the job has left the queue.
    pub fn is_start(&self) -> bool {
        self.json
            .starts_with(r#"{"type":"status","status":"running""#)
    }

    /// Whether this is a `status` event of the job entering the queue: its
    /// submit, or its return for another attempt (its worker was lost).
    pub fn is_queued(&self) -> bool {
        self.json
            .starts_with(r#"{"type":"status","status":"queued""#)
    }

    /// The JSON a client receives: the stored object with `seq` first.
    pub fn wire(&self) -> String {
        match self.json.strip_prefix('{') {
            Some("}") => format!("{{\"seq\":{}}}", self.seq),
            Some(rest) => format!("{{\"seq\":{},{rest}", self.seq),
            None => format!("{{\"seq\":{}}}", self.seq),
        }
    }

    pub fn event(&self) -> Result<JobEvent, serde_json::Error> {
        serde_json::from_str(&self.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_puts_seq_first_and_roundtrips() {
        let stored = StoredEvent {
            seq: 4,
            json: JobEvent::stdout(b"hi\n".to_vec()).to_json(),
        };
        assert_eq!(stored.wire(), r#"{"seq":4,"type":"stdout","data":"hi\n"}"#);
        assert_eq!(stored.event().unwrap(), JobEvent::stdout(b"hi\n".to_vec()));
        let binary = JobEvent::stderr(vec![0xff]).to_json();
        assert_eq!(
            binary,
            r#"{"type":"stderr","data":"/w==","encoding":"base64"}"#
        );
        assert_eq!(
            JobEvent::stage_start("run").to_json(),
            r#"{"type":"stage","stage":"run","state":"start"}"#
        );
        let status: JobEvent =
            serde_json::from_str(r#"{"type":"status","status":"running","worker":"w"}"#).unwrap();
        assert_eq!(
            status,
            JobEvent::Status {
                status: Status::Running,
                worker: Some("w".into())
            }
        );
    }

    #[test]
    fn the_start_and_the_exit_are_told_from_the_stored_json() {
        let stored = |event: JobEvent| StoredEvent {
            seq: 1,
            json: event.to_json(),
        };
        let start = stored(JobEvent::Status {
            status: Status::Running,
            worker: Some("w".into()),
        });
        assert!(start.is_start() && !start.is_exit());
        let queued = stored(JobEvent::Status {
            status: Status::Queued,
            worker: None,
        });
        assert!(!queued.is_start() && !queued.is_exit());
        let exit = stored(JobEvent::Exit {
            status: Status::Succeeded,
            replaces: None,
            result: Box::new(crate::job::JobResult::without_stages(
                Status::Succeeded,
                "python",
                "3",
            )),
        });
        assert!(exit.is_exit() && !exit.is_start());
    }
}
