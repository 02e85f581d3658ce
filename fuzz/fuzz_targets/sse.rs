//! The SSE splitter: any split of any byte stream gives the same events as the whole stream,
//! only whole events come out, and the parsers of what comes out never panic.
#![no_main]
use gateway::sse::{event_data, text_chars, EventSplitter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&cut, stream)) = input.split_first() else {
        return;
    };
    let mut whole = EventSplitter::default();
    let mut expected = whole.push(stream).to_vec();
    expected.extend_from_slice(&whole.finish());

    // Cut into pieces of `cut` bytes (at least 1).
    let mut split = EventSplitter::default();
    let mut got = Vec::new();
    for piece in stream.chunks(usize::from(cut).max(1)) {
        let events = split.push(piece);
        assert!(
            events.is_empty() || events.ends_with(b"\n\n") || events.ends_with(b"\n\r\n"),
            "a part of an event came out"
        );
        got.extend_from_slice(&events);
    }
    got.extend_from_slice(&split.finish());
    assert_eq!(got, expected);
    let _ = event_data(&got);
    let _ = text_chars(&got);
});
