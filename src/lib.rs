//! code-runner: runs untrusted code in per-job hardened containers.
//!
//! # Layout
//!
//! - [`protocol`]: the frames spoken between the worker and the in-sandbox
//!   supervisor (`code-runner-init`); shared by both binaries.
//! - [`init`]: the supervisor that runs as PID 1 inside every sandbox.
#![forbid(unsafe_code)]

pub mod protocol;
