//! The compiled pipeline: the plugins of the YAML, built once at start, run phase by phase.
//!
//! Request phases run in pipeline order; response phases (`on_response`, `on_chunk`, `on_log`)
//! in reverse order, so that the plugin that saw the request first sees the response last.
//! Each phase runs only the plugins that implement it ([`Plugin::phases`]).

use std::sync::Arc;

use plugin_sdk::plugin::{ResponseParts, UpstreamRequest};
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Phases, Plugin, RequestCx, Target,
};

use crate::config::{ConfigErrors, PipelineEntry};

pub struct Pipeline {
    plugins: Vec<Arc<dyn Plugin>>,
    /// The plugins of each phase, in the order the phase runs them.
    request: Vec<Arc<dyn Plugin>>,
    /// For each plugin of `request`: whether it joins a deferred check.
    request_joins: Vec<bool>,
    /// How many plugins at the head of `request` read only the headers (authentication): an
    /// LLM route runs them before it reads the body.
    headers_only: usize,
    route: Vec<Arc<dyn Plugin>>,
    upstream_request: Vec<Arc<dyn Plugin>>,
    response: Vec<Arc<dyn Plugin>>,
    chunk: Vec<Arc<dyn Plugin>>,
    log: Vec<Arc<dyn Plugin>>,
}

impl Pipeline {
    /// Builds every plugin of the pipeline; any failure names the entry.
    pub fn build(entries: &[PipelineEntry], cx: &BuildCx) -> Result<Pipeline, ConfigErrors> {
        let mut plugins = Vec::with_capacity(entries.len());
        let mut issues = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            match entry.descriptor.build(&entry.config, cx) {
                Ok(plugin) => plugins.push(plugin),
                Err(found) => issues.extend(found.into_iter().map(|x| {
                    let path = if x.path.is_empty() {
                        format!("pipeline[{i}]")
                    } else {
                        format!("pipeline[{i}].{}", x.path)
                    };
                    ConfigIssue::new(path, x.message)
                })),
            }
        }
        if issues.is_empty() {
            Ok(Pipeline::new(plugins))
        } else {
            Err(ConfigErrors(issues))
        }
    }

    /// A pipeline of built plugins, in order.
    pub fn new(plugins: Vec<Arc<dyn Plugin>>) -> Pipeline {
        let forward = |phase: Phases| -> Vec<Arc<dyn Plugin>> {
            plugins
                .iter()
                .filter(|p| p.phases().contains(phase))
                .cloned()
                .collect()
        };
        let reverse = |phase: Phases| -> Vec<Arc<dyn Plugin>> {
            let mut in_order = forward(phase);
            in_order.reverse();
            in_order
        };
        let request = forward(Phases::REQUEST);
        let headers_only = request.iter().take_while(|p| !p.reads_body()).count();
        Pipeline {
            headers_only,
            request_joins: request.iter().map(|p| p.joins_deferred()).collect(),
            request,
            route: forward(Phases::ROUTE),
            upstream_request: forward(Phases::UPSTREAM_REQUEST),
            response: reverse(Phases::RESPONSE),
            chunk: reverse(Phases::CHUNK),
            log: reverse(Phases::LOG),
            plugins,
        }
    }

    /// Asks every plugin to reload what it loaded at start; returns the failures (each plugin
    /// that fails keeps what it had).
    pub fn reload(&self) -> Vec<String> {
        self.plugins
            .iter()
            .filter_map(|p| p.reload().err().map(|e| format!("{}: {e}", p.kind())))
            .collect()
    }

    /// The kinds of the plugins, in order.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.kind()).collect()
    }

    /// Runs the request phase. A check a plugin deferred ([`plugin_sdk::deferred`]) is
    /// completed before the next plugin that does not join it runs, and before the phase ends
    /// (a refusal from it wins over an answer a joining plugin gave).
    pub async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        self.run_request(cx, 0..self.request.len()).await
    }

    /// The head of the request phase: the plugins that read only the headers
    /// ([`Plugin::reads_body`]), run before an LLM route reads the body, so that a request
    /// without valid credentials is refused unread. [`Pipeline::on_request_body`] runs the rest.
    pub async fn on_request_headers(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        self.run_request(cx, 0..self.headers_only).await
    }

    /// The rest of the request phase, once the body is read and decoded.
    pub async fn on_request_body(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        self.run_request(cx, self.headers_only..self.request.len())
            .await
    }

    async fn run_request(
        &self,
        cx: &mut RequestCx,
        range: std::ops::Range<usize>,
    ) -> Result<Flow, GatewayError> {
        for (p, joins) in self.request[range.clone()]
            .iter()
            .zip(&self.request_joins[range])
        {
            if !joins {
                cx.complete_deferred().await?;
            }
            if let Flow::Respond(r) = p.on_request(cx).await? {
                cx.complete_deferred().await?;
                return Ok(Flow::Respond(r));
            }
        }
        cx.complete_deferred().await?;
        Ok(Flow::Continue)
    }

    pub async fn on_route(
        &self,
        cx: &mut RequestCx,
        target: &mut Target,
    ) -> Result<Flow, GatewayError> {
        for p in &self.route {
            if let Flow::Respond(r) = p.on_route(cx, target).await? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub async fn on_upstream_request(
        &self,
        cx: &mut RequestCx,
        request: &mut UpstreamRequest,
    ) -> Result<Flow, GatewayError> {
        for p in &self.upstream_request {
            if let Flow::Respond(r) = p.on_upstream_request(cx, request).await? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub async fn on_response(
        &self,
        cx: &mut RequestCx,
        response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        for p in &self.response {
            if let Flow::Respond(r) = p.on_response(cx, response).await? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        for p in &self.chunk {
            if let Flow::Respond(r) = p.on_chunk(cx, chunk)? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub fn on_log(&self, cx: &RequestCx) {
        for p in &self.log {
            p.on_log(cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use plugin_sdk::Route;

    use super::*;

    /// Records the phases it is called in, as `name:phase`.
    struct Recorder {
        name: &'static str,
        phases: Phases,
        calls: Arc<Mutex<Vec<String>>>,
    }

    impl Recorder {
        fn note(&self, phase: &str) {
            self.calls
                .lock()
                .unwrap()
                .push(format!("{}:{phase}", self.name));
        }
    }

    #[async_trait]
    impl Plugin for Recorder {
        fn kind(&self) -> &'static str {
            self.name
        }

        fn phases(&self) -> Phases {
            self.phases
        }

        async fn on_request(&self, _cx: &mut RequestCx) -> Result<Flow, GatewayError> {
            self.note("request");
            Ok(Flow::Continue)
        }

        fn on_chunk(&self, _cx: &mut RequestCx, _chunk: &mut Chunk) -> Result<Flow, GatewayError> {
            self.note("chunk");
            Ok(Flow::Continue)
        }

        fn on_log(&self, _cx: &RequestCx) {
            self.note("log");
        }
    }

    #[tokio::test]
    async fn each_phase_runs_the_plugins_that_implement_it_in_its_order() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let plugin = |name, phases| -> Arc<dyn Plugin> {
            Arc::new(Recorder {
                name,
                phases,
                calls: calls.clone(),
            })
        };
        let pipeline = Pipeline::new(vec![
            plugin("a", Phases::ALL),
            plugin("b", Phases::LOG),
            plugin("c", Phases::REQUEST | Phases::CHUNK | Phases::LOG),
        ]);
        assert_eq!(pipeline.kinds(), ["a", "b", "c"]);
        let mut cx = RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            http::Method::POST,
            "/v1/chat/completions".into(),
        );
        pipeline.on_request(&mut cx).await.unwrap();
        pipeline
            .on_chunk(
                &mut cx,
                &mut Chunk {
                    data: bytes::Bytes::new(),
                },
            )
            .unwrap();
        pipeline.on_log(&cx);
        assert_eq!(
            *calls.lock().unwrap(),
            [
                "a:request",
                "c:request",
                "c:chunk",
                "a:chunk",
                "c:log",
                "b:log",
                "a:log"
            ]
        );
    }

    /// Defers a check that records its completion (and the plugins that joined it), and
    /// refuses when told to.
    struct Deferrer {
        calls: Arc<Mutex<Vec<String>>>,
        refuse: bool,
    }

    struct Check {
        calls: Arc<Mutex<Vec<String>>>,
        refuse: bool,
        joined: Vec<&'static str>,
    }

    #[async_trait]
    impl plugin_sdk::Deferred for Check {
        async fn complete(self: Box<Self>, _cx: &mut RequestCx) -> Result<(), GatewayError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("check[{}]", self.joined.join(",")));
            if self.refuse {
                return Err(GatewayError::new(
                    plugin_sdk::ErrorKind::InvalidRequest,
                    "refused by the deferred check",
                ));
            }
            Ok(())
        }

        fn as_any(&self) -> &(dyn std::any::Any + Send + Sync) {
            self
        }

        fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send + Sync> {
            self
        }
    }

    #[async_trait]
    impl Plugin for Deferrer {
        fn kind(&self) -> &'static str {
            "deferrer"
        }

        async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
            self.calls.lock().unwrap().push("deferrer:request".into());
            cx.defer(Box::new(Check {
                calls: self.calls.clone(),
                refuse: self.refuse,
                joined: Vec::new(),
            }))
            .await?;
            Ok(Flow::Continue)
        }
    }

    /// Joins a deferred [`Check`] and leaves it deferred.
    struct Joiner(Arc<Mutex<Vec<String>>>);

    #[async_trait]
    impl Plugin for Joiner {
        fn kind(&self) -> &'static str {
            "joiner"
        }

        fn joins_deferred(&self) -> bool {
            true
        }

        async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
            self.0.lock().unwrap().push("joiner:request".into());
            if let Some(check) = cx.deferred.take() {
                let mut check = check.into_any().downcast::<Check>().expect("a Check");
                check.joined.push("joiner");
                cx.deferred = Some(check);
            }
            Ok(Flow::Continue)
        }
    }

    fn request_cx() -> RequestCx {
        RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            http::Method::POST,
            "/v1/chat/completions".into(),
        )
    }

    #[tokio::test]
    async fn a_deferred_check_completes_before_the_first_plugin_that_does_not_join_it() {
        for refuse in [false, true] {
            let calls = Arc::new(Mutex::new(Vec::new()));
            let recorder: Arc<dyn Plugin> = Arc::new(Recorder {
                name: "after",
                phases: Phases::REQUEST,
                calls: calls.clone(),
            });
            let pipeline = Pipeline::new(vec![
                Arc::new(Deferrer {
                    calls: calls.clone(),
                    refuse,
                }),
                Arc::new(Joiner(calls.clone())),
                recorder,
            ]);
            let mut cx = request_cx();
            let outcome = pipeline.on_request(&mut cx).await;
            assert!(cx.deferred.is_none());
            if refuse {
                let err = outcome.expect_err("the check refuses");
                assert!(err.message.contains("deferred check"), "{}", err.message);
                // The plugin after the check never saw the refused request.
                assert_eq!(
                    *calls.lock().unwrap(),
                    ["deferrer:request", "joiner:request", "check[joiner]"]
                );
            } else {
                assert!(matches!(outcome, Ok(Flow::Continue)));
                assert_eq!(
                    *calls.lock().unwrap(),
                    [
                        "deferrer:request",
                        "joiner:request",
                        "check[joiner]",
                        "after:request"
                    ]
                );
            }
        }
    }

    #[tokio::test]
    async fn a_check_deferred_by_the_last_plugin_completes_at_the_end_of_the_phase() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let pipeline = Pipeline::new(vec![Arc::new(Deferrer {
            calls: calls.clone(),
            refuse: true,
        })]);
        let mut cx = request_cx();
        assert!(pipeline.on_request(&mut cx).await.is_err());
        assert_eq!(*calls.lock().unwrap(), ["deferrer:request", "check[]"]);
    }
}
