//! Keeps the secrets the host adds to a driver's requests out of what the
//! driver reads back.
//!
//! A server that echoes a request (a debugging endpoint, some error pages)
//! would hand the driver the bearer token or key the host added to it, and
//! the driver could send it on to any other host it may reach. So every
//! response a provider with credentials receives passes through its
//! [`Scrubber`] before the guest sees it: each secret the host sends, as it
//! was sent, percent- or JSON-escaped, or in base64 (standard or URL-safe,
//! padded or not, at any alignment within a longer encoded text), is masked
//! with `*` in every header value and all through the body. A mask has the
//! length of what it hides, so lengths the response states stay true.
//!
//! The body is scrubbed as it streams: a secret split across chunks is
//! found by holding back the last few bytes of each chunk (at most as many
//! as one match can span) until the next arrives.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::HeaderValue;
use http_body::{Body, Frame, SizeHint};

/// The most bytes one byte of a secret takes in an escaped form
/// (`\u00hh`).
const WIDEST_ESCAPE: usize = 6;

/// The shortest base64 stretch taken as a secret's: a shorter one would
/// mask ordinary text too often. A secret of 8 bytes or more is matched at
/// every alignment.
const SHORTEST_ENCODED: usize = 8;

/// Finds and masks one provider's secrets.
#[derive(Debug)]
pub(crate) struct Scrubber {
    /// The secrets as sent; matched also through the escapes an echo may
    /// have applied (see [`spelled`]).
    secrets: Vec<Vec<u8>>,
    /// Their base64 forms, matched as they are.
    encoded: Vec<Vec<u8>>,
    /// Whether a match may start with this byte.
    first: [bool; 256],
    /// The most bytes one match may span.
    longest: usize,
}

impl Scrubber {
    /// A scrubber of `secrets`; `None` when there is nothing to hide.
    pub fn new(secrets: impl IntoIterator<Item = Vec<u8>>) -> Option<Scrubber> {
        let mut secrets: Vec<Vec<u8>> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.sort();
        secrets.dedup();
        if secrets.is_empty() {
            return None;
        }
        let mut encoded = Vec::new();
        for s in &secrets {
            for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                encoded.push(engine.encode(s).into_bytes());
            }
            // Within a longer encoded text, the secret starts at one of
            // three offsets of a 3-byte group. At each, the characters of
            // the groups that hold only its own bytes are always the same:
            // those of the encoding of the secret from its first group
            // boundary on, whole groups only.
            for skip in 0..3 {
                let rest = s.get(skip..).unwrap_or_default();
                let whole = &rest[..rest.len() / 3 * 3];
                for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
                    let core = engine.encode(whole);
                    if core.len() >= SHORTEST_ENCODED {
                        encoded.push(core.into_bytes());
                    }
                }
            }
        }
        encoded.sort();
        encoded.dedup();
        let mut first = [false; 256];
        for e in &encoded {
            first[usize::from(e[0])] = true;
        }
        for s in &secrets {
            first[usize::from(s[0])] = true;
        }
        for escape in [b'%', b'\\', b'+'] {
            first[usize::from(escape)] = true;
        }
        let longest = secrets
            .iter()
            .map(|s| s.len() * WIDEST_ESCAPE)
            .chain(encoded.iter().map(Vec::len))
            .max()
            .unwrap_or(1);
        Some(Scrubber {
            secrets,
            encoded,
            first,
            longest,
        })
    }

    /// The length of the longest match starting at the start of `text`.
    fn match_at(&self, text: &[u8]) -> Option<usize> {
        let literal = self
            .encoded
            .iter()
            .filter(|e| text.starts_with(e))
            .map(Vec::len);
        let escaped = self.secrets.iter().filter_map(|s| spelled(s, text));
        literal.chain(escaped).max()
    }

    /// Masks every match in `buf` that starts before `until` (and ends
    /// within `buf`); whether there was one.
    fn mask(&self, buf: &mut [u8], until: usize) -> bool {
        let mut found = false;
        let mut at = 0;
        while at < until.min(buf.len()) {
            if self.first[usize::from(buf[at])]
                && let Some(len) = self.match_at(&buf[at..])
            {
                buf[at..at + len].fill(b'*');
                found = true;
                at += len;
            } else {
                at += 1;
            }
        }
        found
    }

    /// Masks the secrets in every value of `headers`.
    pub fn headers(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            let len = bytes.len();
            if self.mask(&mut bytes, len) {
                // A mask is `*`, valid wherever the byte it hides was.
                if let Ok(masked) = HeaderValue::from_bytes(&bytes) {
                    *value = masked;
                }
            }
        }
    }

    /// `text` with the secrets masked (an error message that may quote
    /// what was sent).
    pub fn text(&self, text: &str) -> String {
        let mut bytes = text.as_bytes().to_vec();
        let len = bytes.len();
        self.mask(&mut bytes, len);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// `body`, with the secrets masked as it streams.
    pub fn body<B>(self: std::sync::Arc<Self>, body: B) -> Scrubbed<B> {
        Scrubbed {
            inner: body,
            scrubber: self,
            held: BytesMut::new(),
            trailers: None,
            done: false,
        }
    }
}

/// The length of the text at the start of `text` that spells `secret`,
/// each of its bytes as itself or as an echo may have escaped it: `%hh`
/// (either case), `+` for a space, JSON's `\/` and `\u00hh`. Usually there
/// is one way to read the text; a `%`, `\` or space in the secret can make
/// two, so every way is followed and the longest taken.
fn spelled(secret: &[u8], text: &[u8]) -> Option<usize> {
    // Most places do not even start the secret: tell them without a heap
    // allocation.
    forms(*secret.first()?, text)
        .iter()
        .any(Option::is_some)
        .then_some(())?;
    let mut ends = vec![0usize];
    let mut next = Vec::new();
    for &want in secret {
        next.clear();
        for &at in &ends {
            next.extend(
                forms(want, &text[at..])
                    .into_iter()
                    .flatten()
                    .map(|n| at + n),
            );
        }
        if next.is_empty() {
            return None;
        }
        next.sort_unstable();
        next.dedup();
        std::mem::swap(&mut ends, &mut next);
    }
    ends.last().copied()
}

/// The lengths of each way `text` starts with the byte `want`.
fn forms(want: u8, text: &[u8]) -> [Option<usize>; 4] {
    let hex_is = |h: &[u8]| {
        h.len() == 2
            && std::str::from_utf8(h)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                == Some(want)
    };
    let plain = (text.first() == Some(&want)).then_some(1);
    let percent = (text.first() == Some(&b'%') && text.get(1..3).is_some_and(hex_is)).then_some(3);
    let short = match (want, text.get(..2)) {
        (b' ', _) if text.first() == Some(&b'+') => Some(1),
        (b'/', Some(b"\\/")) => Some(2),
        _ => None,
    };
    let unicode =
        (text.len() >= 6 && text[..4].eq_ignore_ascii_case(b"\\u00") && hex_is(&text[4..6]))
            .then_some(6);
    [plain, percent, short, unicode]
}

/// A response body with a provider's secrets masked (see [`Scrubber`]).
pub(crate) struct Scrubbed<B> {
    inner: B,
    scrubber: std::sync::Arc<Scrubber>,
    /// Bytes not passed on yet: the end of what came, which a match may
    /// still continue past.
    held: BytesMut,
    /// Trailers that came while bytes were held; passed on after them.
    trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> Body for Scrubbed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                if !this.held.is_empty() {
                    let len = this.held.len();
                    this.scrubber.mask(&mut this.held, len);
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        // A match that starts within the last `longest - 1`
                        // bytes may go on in the next chunk.
                        let keep = this.scrubber.longest - 1;
                        if this.held.len() > keep {
                            let until = this.held.len() - keep;
                            this.scrubber.mask(&mut this.held, until);
                            return Poll::Ready(Some(Ok(Frame::data(
                                this.held.split_to(until).freeze(),
                            ))));
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut trailers) = frame.into_trailers() {
                            this.scrubber.headers(&mut trailers);
                            this.trailers = Some(trailers);
                        }
                        this.done = true;
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.done = true,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // Masks keep lengths: what is held is still to come.
        let inner = self.inner.size_hint();
        let held = self.held.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::Arc;

    const TOKEN: &str = "tok+en/Secret=42~x";

    fn scrubber() -> Arc<Scrubber> {
        let bearer = format!("Bearer {TOKEN}");
        Arc::new(Scrubber::new([bearer.into_bytes(), TOKEN.as_bytes().to_vec()]).unwrap())
    }

    fn scrub(text: &str) -> String {
        let mut bytes = text.as_bytes().to_vec();
        scrubber().mask(&mut bytes, text.len());
        String::from_utf8(bytes).unwrap()
    }

    /// Every form a test below puts the token in, within `prefix … suffix`.
    fn forms_of(secret: &str) -> Vec<(String, String)> {
        let percent = |upper: bool| {
            secret
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else if upper {
                        format!("%{b:02X}")
                    } else {
                        format!("%{b:02x}")
                    }
                })
                .collect::<String>()
        };
        let mut out = vec![
            ("verbatim".to_owned(), secret.to_owned()),
            ("percent".to_owned(), percent(true)),
            ("percent, lower-case".to_owned(), percent(false)),
            ("json".to_owned(), secret.replace('/', "\\/")),
            (
                "json unicode".to_owned(),
                secret.replace('+', "\\u002B").replace('/', "\\u002f"),
            ),
        ];
        for (name, engine) in [
            ("base64", &STANDARD),
            ("base64 unpadded", &STANDARD_NO_PAD),
            ("base64url", &URL_SAFE),
            ("base64url unpadded", &URL_SAFE_NO_PAD),
        ] {
            out.push((name.to_owned(), engine.encode(secret)));
            // Inside a longer encoded text, at each alignment.
            for pad in 0..3 {
                let inside = format!("{}Authorization: {secret}\r\n", "x".repeat(pad));
                out.push((format!("{name} at offset {pad}"), engine.encode(inside)));
            }
        }
        out
    }

    /// The part of an encoded form the scrubber must hide: every character
    /// that depends only on the token's bytes (for base64, all but at most
    /// two characters at each end of the token's stretch).
    fn leaks(scrubbed: &str) -> bool {
        let decoded: Vec<Vec<u8>> = scrubbed
            .split(|c: char| c.is_whitespace() || c == '*')
            .flat_map(|w| {
                [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD]
                    .into_iter()
                    .filter_map(|e| e.decode(w).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        scrubbed.contains(TOKEN)
            || scrubbed.contains("Secret")
            || decoded.iter().any(|d| d.windows(6).any(|w| w == b"Secret"))
    }

    #[test]
    fn every_form_is_masked_in_place() {
        for (name, form) in forms_of(TOKEN) {
            let text = format!("before {form} after");
            assert!(leaks(&text), "{name}: `leaks` would not see it in {text}");
            let out = scrub(&text);
            assert_eq!(out.len(), text.len(), "{name}");
            assert!(
                out.starts_with("before ") && out.ends_with(" after"),
                "{name}: {out}"
            );
            assert!(out.contains('*'), "{name}: nothing masked in {out}");
            assert!(!leaks(&out), "{name}: {out}");
        }
        for (name, form) in forms_of(&format!("Bearer {TOKEN}")) {
            let out = scrub(&form);
            assert!(!leaks(&out), "{name}: {out}");
        }
    }

    #[test]
    fn other_text_is_left_alone() {
        for text in [
            "",
            "tok+en/Secret=41~x",
            "%%%\\\\++ tok+en/ \\u00",
            "{\"a\": \"tok\\u002ben\"}",
        ] {
            assert_eq!(scrub(text), text);
        }
    }

    #[test]
    fn headers_are_masked() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-echo",
            HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
        );
        h.insert("x-plain", HeaderValue::from_static("nothing here"));
        scrubber().headers(&mut h);
        assert_eq!(h["x-echo"], "*".repeat(7 + TOKEN.len()).as_str());
        assert_eq!(h["x-plain"], "nothing here");
    }

    /// A body that comes in the pieces it is given.
    struct Pieces(std::collections::VecDeque<Bytes>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    /// The body in `chunk`-byte pieces through a scrubber, and back whole.
    async fn through(body: &[u8], chunk: usize) -> Vec<u8> {
        let pieces = body.chunks(chunk).map(Bytes::copy_from_slice).collect();
        scrubber()
            .body(Pieces(pieces))
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn a_secret_split_across_chunks_is_found() {
        let mut body = Vec::new();
        for (_, form) in forms_of(TOKEN) {
            body.extend_from_slice(format!("<{form}>\n").as_bytes());
        }
        let whole = {
            let mut b = body.clone();
            let len = b.len();
            scrubber().mask(&mut b, len);
            b
        };
        assert!(!leaks(&String::from_utf8_lossy(&whole)));
        for chunk in [1, 2, 3, 5, 7, 16, 61, 4096] {
            let out = through(&body, chunk).await;
            assert_eq!(out, whole, "in chunks of {chunk}");
        }
    }
}
