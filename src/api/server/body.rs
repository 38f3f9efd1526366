//! The body hyper writes: the handler's answer in chunks of at most
//! [`CHUNK`], each taken by hyper only once its write buffer has room.
//!
//! Handed whole, a 7.5 MB answer was one frame: hyper took it at once, so
//! nothing showed whether the client read, and hyper (which may flatten a
//! frame into its own buffer) held a copy. In chunks, hyper asks for the
//! next one only when the last has nearly left for the socket, so each ask
//! is the client's progress ([`InFlight::progress`]), and the answer is
//! released by the time its last chunk is queued.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};

use super::connections::InFlight;

/// Largest frame handed to hyper. Its write buffer holds at most its
/// `max_buf_size` (64 KiB) plus one frame; splitting a `Bytes` copies
/// nothing.
pub(super) const CHUNK: usize = 16 * 1024;

/// A response body that ends its request's [`InFlight`] when dropped:
/// hyper drops the body once its last chunk is queued (or the connection
/// is gone), which is when the connection starts waiting again.
pub(super) struct TrackedBody {
    body: Body,
    /// What is left of the inner body's last data frame.
    rest: Bytes,
    in_flight: InFlight,
}

impl TrackedBody {
    pub(super) fn new(body: Body, in_flight: InFlight) -> TrackedBody {
        TrackedBody {
            body,
            rest: Bytes::new(),
            in_flight,
        }
    }

    /// The next chunk of `rest`, keeping the remainder.
    fn chunk(&mut self) -> Bytes {
        let n = self.rest.len().min(CHUNK);
        self.rest.split_to(n)
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Asked again: the client took what was queued before.
        self.in_flight.progress(Instant::now());
        if !self.rest.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(self.chunk()))));
        }
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        match frame.into_data() {
            Ok(data) => {
                self.rest = data;
                Poll::Ready(Some(Ok(Frame::data(self.chunk()))))
            }
            // Trailers pass as they are.
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use hyper::body::Body as _;

    use super::{super::connections::Connections, *};

    #[tokio::test]
    async fn answers_go_out_in_chunks_whole_and_sized() {
        let conns = Arc::new(Connections::new(4));
        let admitted = conns
            .admit(Instant::now(), super::super::connections::Owner::Uid(1000))
            .unwrap();
        let answer: Vec<u8> = (0..CHUNK * 5 / 2).map(|i| i as u8).collect();
        let body = TrackedBody::new(Body::from(answer.clone()), admitted.request_started());
        assert_eq!(body.size_hint().exact(), Some(answer.len() as u64));
        let mut body = std::pin::pin!(body);
        let mut sizes = Vec::new();
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            got.extend_from_slice(&data);
            let left = (answer.len() - got.len()) as u64;
            assert_eq!(body.size_hint().exact(), Some(left));
        }
        assert_eq!(sizes, [CHUNK, CHUNK, CHUNK / 2]);
        assert_eq!(got, answer);
        assert!(body.is_end_stream());
    }
}
