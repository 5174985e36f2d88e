//! The egress proxy: outbound network by allowlist (issue 23). Being
//! written; see the module's files.
