//! Bedrock's binary event-stream framing: arbitrary bytes, read in arbitrary pieces, give
//! messages or a clear error, never a panic or an endless loop.
#![no_main]
use gateway::providers::bedrock::eventstream::FrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&cut, stream)) = input.split_first() else {
        return;
    };
    let mut decoder = FrameDecoder::default();
    'pieces: for piece in stream.chunks(usize::from(cut).max(1)) {
        decoder.push(piece);
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => {
                    let _ = message.header(":event-type");
                }
                Ok(None) => break,
                Err(_) => break 'pieces,
            }
        }
    }
    let _ = decoder.has_partial();
});
