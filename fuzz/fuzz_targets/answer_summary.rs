//! What a passthrough answer reports of its model and usage: any answer, read in any pieces,
//! gives the same reading as read whole, within bounded memory.
#![no_main]
use gateway::passthrough::AnswerSummary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&cut, answer)) = input.split_first() else {
        return;
    };
    let mut whole = AnswerSummary::default();
    whole.push(answer);
    let mut pieces = AnswerSummary::default();
    for piece in answer.chunks(usize::from(cut).max(1)) {
        pieces.push(piece);
    }
    assert_eq!(whole.model(), pieces.model());
    let (a, b) = (whole.usage(), pieces.usage());
    assert_eq!(
        a.map(|u| (u.prompt_tokens, u.completion_tokens)),
        b.map(|u| (u.prompt_tokens, u.completion_tokens))
    );
});
