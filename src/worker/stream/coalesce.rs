//! The events stream's coalescing policy: when waiting output goes out and how it merges into events.

use std::time::Duration;

use tokio::time::Instant;

use crate::job::events::{JobEvent, StageState};

/// Shortest time between two writes of output (a flood is coalesced into
/// one write per interval; output after a quiet spell goes at once).
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(25);
/// How long output after a quiet spell (or answering input) waits for the
/// rest of its burst: `print('x')` is two writes (`x`, then the newline) a
/// few microseconds apart, which belong in one event.
const GATHER: Duration = Duration::from_millis(2);
/// Output waiting that is written without waiting for the interval.
pub(super) const FLUSH_BYTES: usize = 32 * 1024;
/// Largest output event; more output of one stream makes another event.
pub(super) const MAX_EVENT_BYTES: usize = 32 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

#[derive(Debug)]
enum Item {
    Output(Stream, Vec<u8>),
    Event(JobEvent),
}

/// When output that arrives at `now` goes out: after [`GATHER`] when it
/// answers new input or follows a quiet spell (no write within
/// [`FLUSH_INTERVAL`]), else one interval after the last write.
pub(super) fn flush_due(now: Instant, last_write: Option<Instant>, answering: bool) -> Instant {
    let soon = now + GATHER;
    match last_write {
        Some(last) if !answering => soon.max(last + FLUSH_INTERVAL),
        _ => soon,
    }
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 sequence
/// whose other bytes have not come yet (0 to 3).
fn incomplete_utf8_tail(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0x80 {
            // A continuation byte: the lead byte is further back.
            continue;
        }
        let needed = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if back < needed { back } else { 0 };
    }
    0
}

/// The events waiting to be written, in order, with adjacent output of one
/// stream merged.
#[derive(Debug, Default)]
pub(super) struct Coalescer {
    items: Vec<Item>,
    /// Per stream: an incomplete UTF-8 sequence held back at the last take,
    /// put in front of that stream's next output.
    carry: [Vec<u8>; 2],
    /// Output bytes in `items` and `carry`.
    pub(super) output_bytes: usize,
}

impl Coalescer {
    pub(super) fn push_output(&mut self, stream: Stream, data: Vec<u8>) {
        self.output_bytes += data.len();
        let carry = std::mem::take(&mut self.carry[stream.index()]);
        let data = if carry.is_empty() {
            data
        } else {
            let mut joined = carry;
            joined.extend_from_slice(&data);
            joined
        };
        self.append(stream, data);
    }

    /// Adds output after the last item, merging it into that item when it
    /// is output of the same stream with room left.
    fn append(&mut self, stream: Stream, mut data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        if let Some(Item::Output(last, bytes)) = self.items.last_mut()
            && *last == stream
        {
            if bytes.len() < MAX_EVENT_BYTES {
                bytes.extend_from_slice(&data);
                return;
            }
            // Full: a new event, which starts with the character the full
            // one would otherwise end in the middle of.
            let tail = incomplete_utf8_tail(bytes);
            if tail > 0 && tail < bytes.len() {
                let mut start = bytes.split_off(bytes.len() - tail);
                start.extend_from_slice(&data);
                data = start;
            }
        }
        self.items.push(Item::Output(stream, data));
    }

    /// A stage event: it ends what came before it, so the held-back bytes
    /// go out first.
    pub(super) fn push_event(&mut self, event: JobEvent) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let carry = std::mem::take(&mut self.carry[stream.index()]);
            self.append(stream, carry);
        }
        self.items.push(Item::Event(event));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The events to write now, keeping back a stage's end that is the
    /// last thing held (it waits for the job's end, to go with the
    /// result). The output before it is complete: its stage ended.
    pub(super) fn take_holding_stage_end(&mut self) -> (Vec<JobEvent>, usize) {
        let held = match self.items.last() {
            Some(Item::Event(JobEvent::Stage { state, .. })) if *state == StageState::End => {
                self.items.pop()
            }
            _ => None,
        };
        let Some(Item::Event(end)) = held else {
            return self.take(false);
        };
        let taken = self.take(true);
        self.items.push(Item::Event(end));
        taken
    }

    /// The events to write now and how many output bytes they carry. Unless
    /// `last`, an incomplete UTF-8 sequence at the end of a stream's output
    /// is held back for its next output.
    pub(super) fn take(&mut self, last: bool) -> (Vec<JobEvent>, usize) {
        if last {
            for stream in [Stream::Stdout, Stream::Stderr] {
                let carry = std::mem::take(&mut self.carry[stream.index()]);
                self.append(stream, carry);
            }
        } else {
            // Output before a stage event is complete: that stage ended.
            let first = self
                .items
                .iter()
                .rposition(|item| matches!(item, Item::Event(_)))
                .map_or(0, |p| p + 1);
            for stream in [Stream::Stdout, Stream::Stderr] {
                let position = self.items[first..]
                    .iter()
                    .rposition(|item| matches!(item, Item::Output(s, _) if *s == stream));
                let Some(position) = position.map(|p| p + first) else {
                    continue;
                };
                let Item::Output(_, bytes) = &mut self.items[position] else {
                    continue;
                };
                let tail = incomplete_utf8_tail(bytes);
                if tail == 0 {
                    continue;
                }
                self.carry[stream.index()] = bytes.split_off(bytes.len() - tail);
                if bytes.is_empty() {
                    self.items.remove(position);
                }
            }
        }
        let held: usize = self.carry.iter().map(Vec::len).sum();
        let taken = self.output_bytes - held;
        self.output_bytes = held;
        let mut events = Vec::with_capacity(self.items.len());
        let mut pending: Option<(Stream, Vec<u8>)> = None;
        let output = |stream, bytes| match stream {
            Stream::Stdout => JobEvent::stdout(bytes),
            Stream::Stderr => JobEvent::stderr(bytes),
        };
        for item in self.items.drain(..) {
            match item {
                // Removing a held-back item can leave two of one stream
                // next to each other: they merge.
                Item::Output(stream, bytes) => match &mut pending {
                    Some((last, merged))
                        if *last == stream && merged.len() + bytes.len() <= MAX_EVENT_BYTES =>
                    {
                        merged.extend_from_slice(&bytes);
                    }
                    _ => {
                        if let Some((last, merged)) = pending.replace((stream, bytes)) {
                            events.push(output(last, merged));
                        }
                    }
                },
                Item::Event(event) => {
                    if let Some((last, merged)) = pending.take() {
                        events.push(output(last, merged));
                    }
                    events.push(event);
                }
            }
        }
        if let Some((last, merged)) = pending {
            events.push(output(last, merged));
        }
        (events, taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(event: &JobEvent) -> (&'static str, Vec<u8>) {
        let kind = match event {
            JobEvent::Stdout { .. } => "stdout",
            JobEvent::Stderr { .. } => "stderr",
            _ => "other",
        };
        (kind, event.output_bytes().unwrap_or_default())
    }

    #[test]
    fn a_stage_end_held_last_stays_and_the_output_before_it_goes() {
        let end = JobEvent::stage_end("run", &crate::job::StageResult::exited_with(b"42\n"));
        let mut coalescer = Coalescer::default();
        coalescer.push_output(Stream::Stdout, b"42\n".to_vec());
        coalescer.push_event(end.clone());
        let (events, bytes) = coalescer.take_holding_stage_end();
        assert_eq!(
            events.iter().map(data).collect::<Vec<_>>(),
            [("stdout", b"42\n".to_vec())]
        );
        assert_eq!((bytes, coalescer.output_bytes), (3, 0));
        assert_eq!(
            coalescer.take(true),
            (vec![end.clone()], 0),
            "it is still held"
        );

        // Anything after the end (the next stage's start) takes it along.
        coalescer.push_event(end.clone());
        coalescer.push_event(JobEvent::stage_start("run"));
        let (events, _) = coalescer.take_holding_stage_end();
        assert_eq!(events, [end, JobEvent::stage_start("run")]);
        assert!(coalescer.is_empty());
    }

    #[test]
    fn output_after_quiet_goes_at_once_and_a_flood_waits_for_the_interval() {
        let start = Instant::now();
        assert_eq!(
            flush_due(start, None, false),
            start + GATHER,
            "the first output"
        );
        let quiet = start + FLUSH_INTERVAL * 3;
        assert_eq!(
            flush_due(quiet, Some(start), false),
            quiet + GATHER,
            "after a quiet spell"
        );
        let flood = start + FLUSH_INTERVAL / 5;
        assert_eq!(
            flush_due(flood, Some(start), false),
            start + FLUSH_INTERVAL,
            "right after a write"
        );
        assert_eq!(
            flush_due(flood, Some(start), true),
            flood + GATHER,
            "answering new input"
        );
    }

    #[test]
    fn adjacent_output_of_a_stream_merges_and_streams_keep_their_order() {
        let mut c = Coalescer::default();
        c.push_output(Stream::Stdout, b"a".to_vec());
        c.push_output(Stream::Stdout, b"b".to_vec());
        c.push_output(Stream::Stderr, b"c".to_vec());
        c.push_output(Stream::Stdout, b"d".to_vec());
        c.push_event(JobEvent::stage_start("x"));
        c.push_output(Stream::Stdout, b"e".to_vec());
        let (events, bytes) = c.take(false);
        assert_eq!(bytes, 5);
        assert_eq!(
            events.iter().map(data).collect::<Vec<_>>(),
            [
                ("stdout", b"ab".to_vec()),
                ("stderr", b"c".to_vec()),
                ("stdout", b"d".to_vec()),
                ("other", vec![]),
                ("stdout", b"e".to_vec()),
            ]
        );
        assert!(c.is_empty());
        assert_eq!(c.output_bytes, 0);
    }

    #[test]
    fn an_incomplete_character_waits_for_the_rest() {
        let euro = "€".as_bytes(); // 3 bytes
        let mut c = Coalescer::default();
        c.push_output(Stream::Stdout, [b"price: ".as_slice(), &euro[..2]].concat());
        let (events, bytes) = c.take(false);
        assert_eq!(events, [JobEvent::stdout(b"price: ".to_vec())]);
        assert_eq!(bytes, 7);
        assert_eq!(c.output_bytes, 2);
        // Only the incomplete character: nothing to write yet.
        let (events, _) = c.take(false);
        assert!(events.is_empty());
        c.push_output(Stream::Stdout, [&euro[2..], b"!"].concat());
        let (events, bytes) = c.take(false);
        assert_eq!(events, [JobEvent::stdout("€!".as_bytes().to_vec())]);
        assert_eq!(bytes, 4);
        // At the end, what never completed goes out as it is.
        c.push_output(Stream::Stderr, vec![0xE2]);
        assert!(c.take(false).0.is_empty());
        c.push_event(JobEvent::stage_start("y"));
        let (events, bytes) = c.take(false);
        assert_eq!(events[0], JobEvent::stderr(vec![0xE2]));
        assert_eq!(bytes, 1);
        c.push_output(Stream::Stderr, vec![0xF0, 0x9F]);
        let (events, _) = c.take(true);
        assert_eq!(events, [JobEvent::stderr(vec![0xF0, 0x9F])]);
    }

    #[test]
    fn the_tail_check_knows_complete_and_incomplete_sequences() {
        assert_eq!(incomplete_utf8_tail(b""), 0);
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_utf8_tail("€".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_utf8_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_utf8_tail("😀".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&[0xff]), 0);
        assert_eq!(incomplete_utf8_tail(&[0x80, 0x80, 0x80]), 0);
    }

    #[test]
    fn events_stay_under_the_largest_size_without_splitting_characters() {
        let mut c = Coalescer::default();
        let text = "é".repeat(MAX_EVENT_BYTES); // 2 bytes each
        for chunk in text.as_bytes().chunks(1001) {
            c.push_output(Stream::Stdout, chunk.to_vec());
        }
        let (events, bytes) = c.take(true);
        assert_eq!(bytes, text.len());
        assert!(events.len() >= 2, "{}", events.len());
        let mut joined = Vec::new();
        for event in &events {
            let JobEvent::Stdout { encoding, .. } = event else {
                panic!("{event:?}")
            };
            assert_eq!(*encoding, crate::job::Encoding::Utf8);
            let bytes = event.output_bytes().unwrap();
            assert!(bytes.len() <= MAX_EVENT_BYTES + 1001);
            joined.extend(bytes);
        }
        assert_eq!(joined, text.as_bytes());
    }
}
