//! Length-prefixed framing: an incremental decoder with a size bound, and the
//! encoder. See the crate docs for the format.

use bytes::{Buf, BytesMut};

/// One frame as read off the wire: its kind byte and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub kind: u8,
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {length} bytes is larger than the limit of {max} bytes")]
    TooLarge { length: usize, max: usize },
    #[error("frame with length 0 has no kind byte")]
    Empty,
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("frame kind 0x{kind:02x} has an invalid payload: {message}")]
    BadPayload { kind: u8, message: String },
    #[error("stream ended inside a frame ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
}

/// Encodes one frame: `u32 length (big endian) | kind | payload`.
pub fn encode_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len() + 1).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.extend_from_slice(&length.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// Incremental decoder: feed it bytes as they arrive, take whole frames out.
/// It never allocates more than `max_frame` bytes for one frame and never panics
/// on any input.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: BytesMut,
    max_frame: usize,
    failed: bool,
}

impl FrameDecoder {
    pub fn new(max_frame: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_frame,
            failed: false,
        }
    }

    /// Appends bytes read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Returns the next whole frame, `Ok(None)` when more bytes are needed, or
    /// an error; after an error the stream is out of sync and every later call
    /// returns the same kind of error.
    pub fn next_frame(&mut self) -> Result<Option<RawFrame>, FrameError> {
        if self.buffer.len() < 4 {
            return Ok(None);
        }
        let length = u32::from_be_bytes([
            self.buffer[0],
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
        ]) as usize;
        if length == 0 {
            self.failed = true;
            return Err(FrameError::Empty);
        }
        if length > self.max_frame {
            self.failed = true;
            return Err(FrameError::TooLarge {
                length,
                max: self.max_frame,
            });
        }
        if self.buffer.len() < 4 + length {
            self.buffer.reserve(4 + length - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(4);
        let kind = self.buffer[0];
        self.buffer.advance(1);
        let payload = self.buffer.split_to(length - 1).to_vec();
        Ok(Some(RawFrame { kind, payload }))
    }

    /// Call at end of stream: an error if a partial frame is left over.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffer.is_empty() || self.failed {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buffer.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_one_frame() {
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend(&encode_frame(0x83, b"hello"));
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(RawFrame {
                kind: 0x83,
                payload: b"hello".to_vec()
            })
        );
        assert_eq!(decoder.next_frame().unwrap(), None);
        decoder.finish().unwrap();
    }

    #[test]
    fn oversize_frame_is_refused_before_reading_payload() {
        let mut decoder = FrameDecoder::new(16);
        decoder.extend(&[0xff, 0xff, 0xff, 0xff, 0x83]);
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge {
                length: 0xffff_ffff,
                max: 16
            })
        );
    }

    #[test]
    fn zero_length_frame_is_an_error() {
        let mut decoder = FrameDecoder::new(16);
        decoder.extend(&[0, 0, 0, 0]);
        assert_eq!(decoder.next_frame(), Err(FrameError::Empty));
    }

    #[test]
    fn truncated_stream_is_reported() {
        let mut decoder = FrameDecoder::new(64);
        let frame = encode_frame(0x83, b"abcdef");
        decoder.extend(&frame[..7]);
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert_eq!(decoder.finish(), Err(FrameError::Truncated { buffered: 7 }));
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut decoder = FrameDecoder::new(512);
            decoder.extend(&data);
            for _ in 0..data.len() + 1 {
                match decoder.next_frame() {
                    Ok(Some(frame)) => prop_assert!(frame.payload.len() < 512),
                    Ok(None) | Err(_) => break,
                }
            }
            let _ = decoder.finish();
        }

        #[test]
        fn frames_survive_any_chunking(
            frames in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..20),
            split in proptest::collection::vec(1usize..64, 1..50),
        ) {
            let mut wire = Vec::new();
            for (kind, payload) in &frames {
                wire.extend(encode_frame(*kind, payload));
            }
            let mut decoder = FrameDecoder::new(1024);
            let mut decoded = Vec::new();
            let mut offset = 0;
            let mut i = 0;
            while offset < wire.len() {
                let step = split[i % split.len()].min(wire.len() - offset);
                decoder.extend(&wire[offset..offset + step]);
                offset += step;
                i += 1;
                while let Some(frame) = decoder.next_frame().unwrap() {
                    decoded.push((frame.kind, frame.payload));
                }
            }
            decoder.finish().unwrap();
            prop_assert_eq!(decoded, frames);
        }
    }
}
