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
        Pipeline {
            request: forward(Phases::REQUEST),
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

    pub async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        for p in &self.request {
            if let Flow::Respond(r) = p.on_request(cx).await? {
                return Ok(Flow::Respond(r));
            }
        }
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
}
