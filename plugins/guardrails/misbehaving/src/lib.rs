//! `misbehaving`: a guardrail that misbehaves on purpose, to test the host's limits. Never
//! deploy it.
//!
//! Config: `{"mode": "..."}`, applied to every check:
//! - `trap`: aborts (a wasm trap);
//! - `panic`: panics (its message reaches the gateway's log);
//! - `loop`: loops forever (the host's deadline stops it);
//! - `allocate`: allocates without bound (the host's memory limit stops it);
//! - `bad-verdict`: answers with a verdict that does not fit the check;
//! - `init-error`: refuses its config;
//! - `uses-wasi`: prints to stdout and stderr, fills a `HashMap` and reads the clock (which
//!   traps unless the operator grants `clock`), then allows;
//! - `allow`: behaves.

use gateway_guardrail::{export_guardrail, ChatRequest, Guardrail, Stream, Verdict};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    Trap,
    Panic,
    Loop,
    Allocate,
    BadVerdict,
    InitError,
    UsesWasi,
    #[default]
    Allow,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    mode: Mode,
}

#[derive(Default)]
struct Misbehaving {
    mode: Mode,
}

impl Guardrail for Misbehaving {
    fn init(&mut self, config: &str) -> Result<(), String> {
        let config: Config = serde_json::from_str(config).map_err(|e| e.to_string())?;
        if config.mode == Mode::InitError {
            return Err("init-error: this guardrail refuses every config".into());
        }
        self.mode = config.mode;
        Ok(())
    }

    fn check_request(&self, _request: &ChatRequest) -> Verdict {
        self.misbehave();
        match self.mode {
            Mode::BadVerdict => Verdict::RewriteText("not for requests".into()),
            _ => Verdict::Allow,
        }
    }

    fn check_response(&self, _request: &ChatRequest, _text: &str) -> Verdict {
        self.misbehave();
        match self.mode {
            Mode::BadVerdict => Verdict::RewriteMessages(Vec::new()),
            _ => Verdict::Allow,
        }
    }

    fn check_stream_delta(&self, _stream: &mut Stream, _delta: &str) -> Verdict {
        self.misbehave();
        match self.mode {
            Mode::BadVerdict => Verdict::RewriteMessages(Vec::new()),
            _ => Verdict::Allow,
        }
    }
}

export_guardrail!(Misbehaving);

impl Misbehaving {
    fn misbehave(&self) {
        match self.mode {
            Mode::Trap => std::process::abort(),
            Mode::Panic => panic!("misbehaving on purpose"),
            Mode::Loop => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            Mode::Allocate => {
                let mut kept: Vec<Vec<u8>> = Vec::new();
                loop {
                    kept.push(std::hint::black_box(vec![1u8; 1 << 20]));
                }
            }
            Mode::UsesWasi => {
                println!("misbehaving: to stdout");
                eprintln!("misbehaving: to stderr");
                let mut seen = std::collections::HashMap::new();
                seen.insert("key", 1);
                std::hint::black_box(&seen);
                std::hint::black_box(std::time::SystemTime::now());
            }
            Mode::BadVerdict | Mode::InitError | Mode::Allow => {}
        }
    }
}
