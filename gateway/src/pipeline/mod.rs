//! The compiled pipeline: the plugins of the YAML, built once at start, run phase by phase.
//!
//! Request phases run in pipeline order; response phases (`on_response`, `on_chunk`, `on_log`)
//! in reverse order, so that the plugin that saw the request first sees the response last.

use std::sync::Arc;

use plugin_sdk::plugin::{ResponseParts, UpstreamRequest};
use plugin_sdk::{BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Plugin, RequestCx, Target};

use crate::config::{ConfigErrors, PipelineEntry};

pub struct Pipeline {
    plugins: Vec<Arc<dyn Plugin>>,
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
            Ok(Pipeline { plugins })
        } else {
            Err(ConfigErrors(issues))
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
        for p in &self.plugins {
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
        for p in &self.plugins {
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
        for p in &self.plugins {
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
        for p in self.plugins.iter().rev() {
            if let Flow::Respond(r) = p.on_response(cx, response).await? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        for p in self.plugins.iter().rev() {
            if let Flow::Respond(r) = p.on_chunk(cx, chunk)? {
                return Ok(Flow::Respond(r));
            }
        }
        Ok(Flow::Continue)
    }

    pub fn on_log(&self, cx: &RequestCx) {
        for p in self.plugins.iter().rev() {
            p.on_log(cx);
        }
    }
}
