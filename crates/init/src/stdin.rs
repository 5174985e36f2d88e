//! Stdin bytes from the host waiting for the stage that reads them.
//!
//! Frames are queued as they arrive, also before the stage that takes stdin
//! has started (the worker may send input while the compile stage runs), and
//! written to the stage's pipe only as fast as the stage reads. The queue is
//! bounded: the worker bounds stdin, and past [`MAX_QUEUED_STDIN`] the
//! supervisor drops what it holds and closes stdin rather than grow.

use std::collections::VecDeque;

/// Most stdin bytes held for a stage that is not reading them.
pub(crate) const MAX_QUEUED_STDIN: usize = 64 * 1024 * 1024;

#[derive(Debug, Default)]
pub(crate) struct StdinQueue {
    chunks: VecDeque<Vec<u8>>,
    /// Bytes of the front chunk already written.
    offset: usize,
    queued: usize,
    /// The host sent `stdin_close` (or its stream ended): close the pipe once
    /// the queue is empty, and ignore later input.
    close_requested: bool,
}

impl StdinQueue {
    pub(crate) fn push(&mut self, data: Vec<u8>) {
        if self.close_requested || data.is_empty() {
            return;
        }
        if self.queued.saturating_add(data.len()) > MAX_QUEUED_STDIN {
            eprintln!(
                "code-runner-init: more than {MAX_QUEUED_STDIN} bytes of stdin are waiting; \
                 dropping them and closing stdin"
            );
            self.discard();
            self.close_requested = true;
            return;
        }
        self.queued += data.len();
        self.chunks.push_back(data);
    }

    pub(crate) fn request_close(&mut self) {
        self.close_requested = true;
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.queued > 0
    }

    /// The stage's stdin pipe should be closed now.
    pub(crate) fn should_close(&self) -> bool {
        self.close_requested && self.queued == 0
    }

    /// The next bytes to write, if any.
    pub(crate) fn front(&self) -> Option<&[u8]> {
        self.chunks
            .front()
            .map(|chunk| chunk.get(self.offset..).unwrap_or_default())
    }

    /// Marks `written` bytes of [`StdinQueue::front`] as delivered.
    pub(crate) fn consume(&mut self, written: usize) {
        let Some(front) = self.chunks.front() else {
            return;
        };
        let remaining = front.len().saturating_sub(self.offset);
        let written = written.min(remaining);
        self.queued -= written;
        if written == remaining {
            self.chunks.pop_front();
            self.offset = 0;
        } else {
            self.offset += written;
        }
    }

    /// Forgets every queued byte (the stage closed its stdin).
    pub(crate) fn discard(&mut self) {
        self.chunks.clear();
        self.offset = 0;
        self.queued = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_come_out_in_order_across_partial_writes() {
        let mut store = StdinQueue::default();
        store.push(b"hello ".to_vec());
        store.push(b"world".to_vec());
        let mut out = Vec::new();
        while let Some(front) = store.front() {
            let take = front.len().min(4);
            out.extend_from_slice(&front[..take]);
            store.consume(take);
        }
        assert_eq!(out, b"hello world");
        assert!(!store.has_pending());
    }

    #[test]
    fn close_waits_for_queued_bytes_and_ignores_later_input() {
        let mut store = StdinQueue::default();
        store.push(b"abc".to_vec());
        store.request_close();
        assert!(!store.should_close());
        store.push(b"late".to_vec());
        store.consume(3);
        assert!(store.should_close());
        assert_eq!(store.front(), None);
    }

    #[test]
    fn overflow_drops_everything_and_closes() {
        let mut store = StdinQueue::default();
        store.push(vec![0; MAX_QUEUED_STDIN - 1]);
        store.push(vec![0; 2]);
        assert!(!store.has_pending());
        assert!(store.should_close());
    }
}
