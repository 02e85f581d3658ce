//! Request bodies of every first-class route: a decoded request or a 4xx naming the problem.
#![no_main]
use libfuzzer_sys::fuzz_target;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::Route;

const ROUTES: [Route; 4] = [
    Route::ChatCompletions,
    Route::Embeddings,
    Route::Moderations,
    Route::Messages,
];

fuzz_target!(|input: &[u8]| {
    let Some((&which, body)) = input.split_first() else {
        return;
    };
    let route = ROUTES[usize::from(which) % ROUTES.len()];
    match LlmRequest::decode(route, body) {
        Ok(request) => {
            let _ = request.model();
            let _ = request.is_stream();
        }
        Err(e) => assert!(e.status().is_client_error(), "{}", e.message),
    }
});
