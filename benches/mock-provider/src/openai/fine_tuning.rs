//! `GET /fine_tuning/jobs`: a fixed list of jobs with cursor paging
//! (`after`, `limit`), for tests of list passthrough.

use http::StatusCode;
use serde::Serialize;

use super::{ApiError, HandlerResult};
use crate::body;
use crate::server::Ctx;

/// Jobs `ftjob-mock-000` through `ftjob-mock-024`, oldest first.
const JOB_COUNT: usize = 25;
/// Page size when `limit` is absent, as in OpenAI's API.
const DEFAULT_LIMIT: usize = 20;
const BASE_MODEL: &str = "gpt-4o-mini-2024-07-18";
const FIRST_CREATED_AT: u64 = 1_700_000_000;

#[derive(Serialize)]
struct JobList {
    object: &'static str,
    data: Vec<Job>,
    has_more: bool,
}

#[derive(Serialize)]
struct Job {
    id: String,
    object: &'static str,
    created_at: u64,
    error: Option<JobError>,
    fine_tuned_model: Option<String>,
    finished_at: Option<u64>,
    hyperparameters: Hyperparameters,
    model: &'static str,
    organization_id: &'static str,
    result_files: Vec<String>,
    status: &'static str,
    trained_tokens: Option<u64>,
    training_file: String,
    validation_file: Option<String>,
    seed: u64,
    integrations: Vec<()>,
    estimated_finish: Option<u64>,
}

#[derive(Serialize)]
struct JobError {
    code: String,
    message: String,
    param: Option<String>,
}

#[derive(Serialize)]
struct Hyperparameters {
    n_epochs: Epochs,
    batch_size: &'static str,
    learning_rate_multiplier: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Epochs {
    Auto(&'static str),
    Count(u32),
}

fn job_id(index: usize) -> String {
    format!("ftjob-mock-{index:03}")
}

/// Job `index`: statuses cycle succeeded / running / validating_files and
/// the other fields follow from the status.
fn job(index: usize) -> Job {
    let created_at = FIRST_CREATED_AT + index as u64 * 3600;
    let status = match index % 3 {
        0 => "succeeded",
        1 => "running",
        _ => "validating_files",
    };
    let succeeded = status == "succeeded";
    let even = index & 1 == 0;
    Job {
        id: job_id(index),
        object: "fine_tuning.job",
        created_at,
        error: None,
        fine_tuned_model: succeeded.then(|| format!("ft:{BASE_MODEL}:mock-org::mock{index:03}")),
        finished_at: succeeded.then_some(created_at + 1800),
        hyperparameters: Hyperparameters {
            n_epochs: if even {
                Epochs::Auto("auto")
            } else {
                Epochs::Count(3)
            },
            batch_size: "auto",
            learning_rate_multiplier: "auto",
        },
        model: BASE_MODEL,
        organization_id: "org-mock",
        result_files: Vec::new(),
        status,
        trained_tokens: succeeded.then_some(10_000 + index as u64 * 100),
        training_file: format!("file-mock-train-{index:03}"),
        validation_file: even.then(|| format!("file-mock-valid-{index:03}")),
        seed: 42 + index as u64,
        integrations: Vec::new(),
        estimated_finish: (status == "running").then_some(created_at + 7200),
    }
}

pub(super) fn list_jobs(ctx: &Ctx<'_>) -> HandlerResult {
    let mut after = None;
    let mut limit = DEFAULT_LIMIT;
    for pair in ctx.uri.query().unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "after" => after = Some(value),
            "limit" => {
                limit = value.parse().map_err(|_| {
                    ApiError::invalid_param(
                        "limit",
                        format!("'limit' must be a non-negative integer, got '{value}'"),
                    )
                })?;
            }
            _ => {}
        }
    }
    // An unknown `after` id starts from the beginning.
    let start = after
        .and_then(|id| (0..JOB_COUNT).find(|&i| job_id(i) == id))
        .map_or(0, |i| i + 1);
    let end = start.saturating_add(limit).min(JOB_COUNT);
    let list = JobList {
        object: "list",
        data: (start..end).map(job).collect(),
        has_more: end < JOB_COUNT,
    };
    Ok(body::json(StatusCode::OK, &list))
}
