//! A fast, deterministic fake of LLM provider HTTP APIs for tests and benchmarks.
//!
//! [`MockProvider`] binds a local port and answers OpenAI- and
//! Anthropic-shaped requests; every path may carry an optional `/v1` prefix:
//!
//! - `POST /v1/chat/completions`: `"mock reply to: <last user text>"`, `n`
//!   choices, `max_tokens` truncation, tool calls, SSE streaming with
//!   optional usage chunk. Tokens are counted as whitespace-separated words.
//! - `POST /v1/embeddings`: deterministic vectors (`dimensions`, default 8),
//!   float or base64.
//! - `POST /v1/moderations`: keyword-based flags.
//! - `GET /v1/fine_tuning/jobs`: 25 fixed jobs with `after` / `limit` paging.
//! - `GET /v1/models`: one model, `mock-model`.
//! - `POST /v1/messages`: Anthropic's Messages API. Checks the request as
//!   Anthropic would (`x-api-key`, `anthropic-version`, fields, roles, block
//!   types, no OpenAI-only fields; 400/401 in Anthropic's error shape),
//!   replies `"mock reply to: <last user text>"` with `stop_sequences` and
//!   `max_tokens` stops, tool use, thinking blocks, named-event SSE
//!   streaming, and echoes the system prompt in `x-mock-system`.
//! - any method on `/v1/echo[/...]`: the request body back, with
//!   `x-mock-method`, `x-mock-path`, `x-mock-body-len` and `x-mock-custom`.
//! - `POST /model/{modelId}/converse`, `/converse-stream`, `/invoke`,
//!   `/invoke-with-response-stream`: AWS Bedrock (see the `bedrock` module).
//!   Every request must carry a valid AWS Signature Version 4 for service
//!   `bedrock` made with [`AWS_ACCESS_KEY_ID`] / [`AWS_SECRET_ACCESS_KEY`]
//!   (any region, optional session token; [`sigv4::sign`] makes one), else
//!   403 as AWS answers. Converse is checked as Bedrock checks it and
//!   replies `"mock reply to: <last user text>"` with `maxTokens` and stop
//!   sequence stops and tool use; the streams are
//!   `application/vnd.amazon.eventstream` frames. Invoke takes Titan and
//!   Cohere embedding bodies and Anthropic Messages bodies
//!   (`anthropic_version: bedrock-2023-05-31`, streamed as `chunk` events).
//!   Errors are `x-amzn-errortype: <Name>` with `{"message"}`; answers
//!   echo the signing region in `x-mock-aws-region` and the session token
//!   in `x-mock-aws-session-token`.
//! - `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
//!   `:embedContent`, `:batchEmbedContents` (also under `/v1/models/`): the
//!   Gemini API (see the `gemini` module). Needs an API key in
//!   `x-goog-api-key` or `?key=` (403 `PERMISSION_DENIED` without one, 401
//!   `UNAUTHENTICATED` for an `Authorization` header instead). Checks field
//!   names as Google's parser does (camelCase or snake_case; OpenAI fields
//!   get `Unknown name "..."`), roles `user` / `model`, one datum per part,
//!   `generationConfig`, function declarations and their schemas; replies
//!   `"mock reply to: <last user text>"` with `stopSequences` and
//!   `maxOutputTokens` stops, `candidateCount`, function calls (then text
//!   answering the `functionResponse`), and a `SAFETY` block for a user
//!   text saying `unsafe`. Streams are SSE (`data: ...\r\n\r\n`) with
//!   `?alt=sse`, else one JSON array. Embeddings are the OpenAI route's
//!   vectors (`outputDimensionality`, default 8). Errors are
//!   `{"error":{"code","message","status"}}`.
//! - `POST /v1/projects/{p}/locations/{r}/publishers/google/models/{m}:generateContent`,
//!   `:streamGenerateContent`, `:predict` (text embeddings), and
//!   `.../publishers/anthropic/models/{m}:rawPredict`, `:streamRawPredict`:
//!   Vertex AI, with `Authorization: Bearer` (401 `UNAUTHENTICATED`
//!   without). Gemini models behave as on the Gemini API; Anthropic models
//!   take Messages bodies with `anthropic_version: vertex-2023-10-16` and no
//!   `model`, answered as `/v1/messages` answers them, with the URL's model.
//!   The routes' answers echo `x-mock-vertex-project` and
//!   `x-mock-vertex-region` (injected faults are answered before routing).
//! - `POST /v2/chat`, `POST /v2/embed`: Cohere's v2 API with
//!   `Authorization: Bearer`. Checks fields as Cohere does (OpenAI-only ones
//!   such as `n`, `top_p`, `stop` are refused), roles and `tool_call_id`;
//!   replies with `max_tokens` / `stop_sequences` stops and tool calls (then
//!   text answering the tool result), named-event SSE streaming
//!   (`message-start` ... `message-end`); embeddings need `input_type`
//!   (float, int8, uint8). Errors are `{"message"}`.
//! - `POST /openai/deployments/{deployment}/chat/completions`, `/embeddings`:
//!   Azure OpenAI. Needs `?api-version=YYYY-MM-DD[-preview]` (404 `Resource
//!   not found` without) and an `api-key` header (401 without); then answers
//!   as the OpenAI routes do, `model` defaulting to the deployment. Azure's
//!   own errors are `{"error":{"code":"<status>","message"}}`; answers echo
//!   `x-mock-azure-deployment` and `x-mock-azure-api-version`.
//! - anything else: 404 with an OpenAI-shaped error (Anthropic-shaped under
//!   `/v1/messages/`; Google-, Cohere- and Azure-shaped under `/v1beta/`,
//!   `/v1/projects/`, `/v2/` and `/openai/`).
//!
//! # Fault injection
//!
//! Every route understands the same faults, given as request headers or as
//! an `/x-mock/<k=v;k=v>` path prefix (e.g.
//! `/x-mock/status=500;delay_ms=300/v1/chat/completions`, or a base URL of
//! `http://127.0.0.1:PORT/x-mock/delay_ms=300/v1`). The prefix is stripped
//! before routing and header values override prefix values. Bad values
//! answer 400.
//!
//! | prefix key         | header                    | effect |
//! |--------------------|---------------------------|--------|
//! | `status`           | `x-mock-status`           | answer this status (200..=599) with `{"error":{..., "type":"mock_error","code":"<status>"}}`; on Anthropic routes `{"type":"error","error":{"type":"api_error","message":...}}` (`rate_limit_error` for 429, `overloaded_error` for 529); on Bedrock routes `{"message"}` with `x-amzn-errortype` (`ThrottlingException` for 429, ...); on Gemini / Vertex routes `{"error":{"code","message","status"}}` (`RESOURCE_EXHAUSTED` for 429, `UNAVAILABLE` for 503, ...); on Cohere routes `{"message"}`; on Azure routes `{"error":{"code":"<status>","message"}}` |
//! | `retry_after_ms`   | `x-mock-retry-after-ms`   | `retry-after-ms` header sent with injected 429/503 (and 529 on Anthropic routes; default 10) |
//! | `delay_ms`         | `x-mock-delay-ms`         | sleep before the response head |
//! | `chunk_delay_ms`   | `x-mock-chunk-delay-ms`   | sleep between SSE events |
//! | `disconnect_after` | `x-mock-disconnect-after` | streams: send n events, then drop the connection without the terminating chunk; other responses: close without answering |
//! | `words`            | `x-mock-words`            | chat replies are exactly n words, `w1 w2 ... wn` |
//! | `fail_first`       | `x-mock-fail-first`       | only the first n requests with the same faults and route fail (with `status`, default 503, or with `disconnect_after` / `stream_error` if given); later ones succeed |
//! | `stream_error`     | `x-mock-stream-error`     | `1`: Anthropic streams send `event: error` (`overloaded_error`) after the first content delta and end; Bedrock streams send a `throttlingException` exception frame there; other routes ignore it |
//!
//! `fail_first` counters live in each [`MockProvider`] instance.

mod anthropic;
mod bedrock;
mod body;
mod cohere;
mod echo;
mod faults;
mod gemini;
mod openai;
mod query;
mod record;
mod server;
mod sse;
mod text;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use bedrock::sigv4;
pub use bedrock::{AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY};
pub use record::RecordedRequest;

use server::Shared;

/// Options for [`MockProvider::start_with`].
#[derive(Clone, Debug)]
pub struct MockOptions {
    /// Keep a copy of every request (method, path, headers, body) for
    /// [`MockProvider::requests`]. Default: `true`. Turn it off in benchmarks
    /// to avoid the copy and the lock.
    pub record: bool,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions { record: true }
    }
}

/// A running mock provider bound to a local TCP port.
///
/// Serving happens on the tokio runtime that was current when it was started.
/// Dropping it stops accepting new connections and asks open connections to
/// close once their in-flight response is done.
pub struct MockProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
    // Dropping the sender tells every connection task to shut down gracefully.
    _shutdown: watch::Sender<()>,
}

impl MockProvider {
    /// Binds `127.0.0.1:0` (an ephemeral port) with recording on and starts
    /// serving on the current tokio runtime.
    ///
    /// # Panics
    /// Panics if the loopback address cannot be bound, which only happens on
    /// a broken test machine.
    pub async fn start() -> MockProvider {
        Self::start_with(MockOptions::default()).await
    }

    /// Like [`MockProvider::start`] with explicit options.
    ///
    /// # Panics
    /// Panics if the loopback address cannot be bound.
    pub async fn start_with(options: MockOptions) -> MockProvider {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        match Self::start_on_with(addr, options).await {
            Ok(mock) => mock,
            Err(err) => panic!("mock provider: cannot bind {addr}: {err}"),
        }
    }

    /// Binds `addr` with recording on and starts serving on the current tokio
    /// runtime.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<MockProvider> {
        Self::start_on_with(addr, MockOptions::default()).await
    }

    /// Binds `addr` with the given options and starts serving on the current
    /// tokio runtime.
    pub async fn start_on_with(
        addr: SocketAddr,
        options: MockOptions,
    ) -> std::io::Result<MockProvider> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(options.record));
        let (shutdown_tx, shutdown_rx) = watch::channel(());
        let accept_task = tokio::spawn(server::accept_loop(
            listener,
            Arc::clone(&shared),
            shutdown_rx,
        ));
        Ok(MockProvider {
            addr,
            shared,
            accept_task,
            _shutdown: shutdown_tx,
        })
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// OpenAI-style base URL, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Snapshot of every request received so far, in arrival order. Empty
    /// when recording is off.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log.snapshot()
    }

    /// Forgets the recorded requests. Does not reset [`Self::request_count`]
    /// or the `fail_first` counters.
    pub fn clear_requests(&self) {
        self.shared.log.clear();
    }

    /// Number of requests whose handling has begun since start, counted
    /// whether or not recording is on.
    pub fn request_count(&self) -> usize {
        self.shared.request_count.load(Ordering::Relaxed)
    }
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl std::fmt::Debug for MockProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockProvider")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}
