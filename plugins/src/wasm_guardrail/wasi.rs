//! The few WASI functions a guardrail may reach, each behind a grant.
//!
//! A component built for `wasm32-wasip2` imports WASI interfaces whether it uses them or not
//! (the standard library links them in). The host defines the granted ones under the exact
//! names the component imports, and every other import traps when called. Always there, because
//! they give nothing away:
//!
//! - `wasi:random/insecure-seed` (the standard library's `HashMap` seeds itself with it);
//! - `wasi:cli/stderr`, whose writes go nowhere unless `stderr` is granted (then each line is
//!   logged at warn level, tagged with the guardrail's id), and `wasi:cli/stdout`, whose writes
//!   always go nowhere (a stray `println!` does not trap).
//!
//! Grants: `clock` (`wasi:clocks/wall-clock`, `wasi:clocks/monotonic-clock`: `now` and
//! `resolution`), `random` (`wasi:random/random`, `wasi:random/insecure`), `stderr`. There is no
//! grant for files, sockets, environment variables or arguments.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceDynamic, ResourceType, Val};
use wasmtime::{AsContextMut, StoreContextMut};

use super::runtime::{engine, truncate, HostState};

/// A WASI capability the operator grants a guardrail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Grant {
    /// Wall-clock and monotonic time.
    Clock,
    /// Random bytes.
    Random,
    /// stderr lines go to the gateway's log.
    Stderr,
}

/// The most random bytes one call may ask for.
const MAX_RANDOM_BYTES: u64 = 1 << 20;
/// The longest stderr line logged; the rest of the line is dropped.
const MAX_STDERR_LINE: usize = 1024;

/// Every resource type the WASI imports name (`output-stream`, `pollable`...) is one host
/// type per name, the same in every interface that uses it, numbered in the order met after
/// these two, which the host makes itself.
const OUTPUT_STREAM: u32 = 0;
const POLLABLE: u32 = 1;
const HOST_MADE: [&str; 2] = ["output-stream", "pollable"];

/// Defines the granted WASI functions for the imports `component` has.
pub fn add_to_linker(
    linker: &mut Linker<HostState>,
    component: &Component,
    grants: &[Grant],
) -> Result<(), String> {
    let engine = engine()?;
    let clock = grants.contains(&Grant::Clock);
    let random = grants.contains(&Grant::Random);
    let ty = component.component_type();
    let mut resources: Vec<String> = HOST_MADE.iter().map(|r| (*r).to_owned()).collect();
    let mut instances = Vec::new();
    for (name, item) in ty.imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        let mut names = Vec::new();
        for (export, item) in instance.exports(engine) {
            if matches!(item.ty, ComponentItem::Resource(_)) {
                if !resources.iter().any(|r| r == export) {
                    resources.push(export.to_owned());
                }
                names.push(export.to_owned());
            }
        }
        instances.push((name.to_owned(), names));
    }
    for (name, resource_names) in instances {
        // The host interface is bound by the generated code.
        if name.starts_with("gateway:") {
            continue;
        }
        let base = name.split('@').next().unwrap_or_default();
        let result = (|| {
            {
                let mut i = linker.instance(&name)?;
                for r in &resource_names {
                    let id = resources.iter().position(|x| x == r).unwrap_or(0) as u32;
                    i.resource(r, ResourceType::host_dynamic(id), |_, _| Ok(()))?;
                }
            }
            match base {
                "wasi:random/insecure-seed" => define_insecure_seed(linker, &name),
                "wasi:random/random" if random => define_random(linker, &name, ""),
                "wasi:random/insecure" if random => define_random(linker, &name, "insecure-"),
                "wasi:clocks/wall-clock" if clock => define_wall_clock(linker, &name),
                "wasi:clocks/monotonic-clock" if clock => define_monotonic_clock(linker, &name),
                "wasi:cli/stderr" => define_stdio(linker, &name, "get-stderr", STDERR),
                "wasi:cli/stdout" => define_stdio(linker, &name, "get-stdout", STDOUT),
                "wasi:io/streams" => define_streams(linker, &name),
                "wasi:io/poll" => define_poll(linker, &name),
                _ => Ok(()),
            }
        })();
        result.map_err(|e| format!("cannot link {name}: {e:#}"))?;
    }
    Ok(())
}

/// An unpredictable 64-bit number: SipHash under the standard library's randomly seeded keys
/// (fresh keys each call) of a counter.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

fn random_bytes(len: u64) -> wasmtime::Result<Vec<Val>> {
    if len > MAX_RANDOM_BYTES {
        wasmtime::bail!("a guardrail may ask for at most {MAX_RANDOM_BYTES} random bytes at once");
    }
    let mut out = Vec::with_capacity(len as usize);
    while (out.len() as u64) < len {
        for b in random_u64().to_le_bytes() {
            if (out.len() as u64) < len {
                out.push(Val::U8(b));
            }
        }
    }
    Ok(out)
}

fn define_insecure_seed(linker: &mut Linker<HostState>, name: &str) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    i.func_new("insecure-seed", |_, _, _, results| {
        results[0] = Val::Tuple(vec![Val::U64(random_u64()), Val::U64(random_u64())]);
        Ok(())
    })
}

fn define_random(linker: &mut Linker<HostState>, name: &str, prefix: &str) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    i.func_new(
        &format!("get-{prefix}random-bytes"),
        |_, _, params, results| {
            let Some(Val::U64(len)) = params.first() else {
                wasmtime::bail!("get-random-bytes takes a u64");
            };
            results[0] = Val::List(random_bytes(*len)?);
            Ok(())
        },
    )?;
    i.func_new(&format!("get-{prefix}random-u64"), |_, _, _, results| {
        results[0] = Val::U64(random_u64());
        Ok(())
    })
}

fn datetime(seconds: u64, nanoseconds: u32) -> Val {
    Val::Record(vec![
        ("seconds".into(), Val::U64(seconds)),
        ("nanoseconds".into(), Val::U32(nanoseconds)),
    ])
}

fn define_wall_clock(linker: &mut Linker<HostState>, name: &str) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    i.func_new("now", |_, _, _, results| {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        results[0] = datetime(d.as_secs(), d.subsec_nanos());
        Ok(())
    })?;
    i.func_new("resolution", |_, _, _, results| {
        results[0] = datetime(0, 1);
        Ok(())
    })
}

fn define_monotonic_clock(linker: &mut Linker<HostState>, name: &str) -> wasmtime::Result<()> {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    let mut i = linker.instance(name)?;
    i.func_new("now", move |_, _, _, results| {
        results[0] = Val::U64(start.elapsed().as_nanos() as u64);
        Ok(())
    })?;
    i.func_new("resolution", |_, _, _, results| {
        results[0] = Val::U64(1);
        Ok(())
    })
}

/// The two output streams there are, by their representation.
const STDERR: u32 = 0;
const STDOUT: u32 = 1;

fn define_stdio(
    linker: &mut Linker<HostState>,
    name: &str,
    getter: &str,
    rep: u32,
) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    i.func_new(getter, move |mut store, _, _, results| {
        let stream = ResourceDynamic::new_own(rep, OUTPUT_STREAM);
        results[0] = Val::Resource(stream.try_into_resource_any(&mut store)?);
        Ok(())
    })
}

/// Output streams: stderr and stdout. Writes are taken whole; stdout's go nowhere.
fn define_streams(linker: &mut Linker<HostState>, name: &str) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    let ok = |value: Option<Val>| Val::Result(Ok(value.map(Box::new)));
    i.func_new(
        "[method]output-stream.check-write",
        move |store, _, params, results| {
            release_borrows(store, params)?;
            results[0] = ok(Some(Val::U64(4096)));
            Ok(())
        },
    )?;
    for method in ["write", "blocking-write-and-flush"] {
        i.func_new(
            &format!("[method]output-stream.{method}"),
            move |mut store, _, params, results| {
                let stream = match params.first() {
                    Some(Val::Resource(r)) => {
                        ResourceDynamic::try_from_resource_any(*r, &mut store)
                            .map(|r| r.rep())
                            .unwrap_or(STDOUT)
                    }
                    _ => STDOUT,
                };
                if let (STDERR, Some(Val::List(bytes))) = (stream, params.get(1)) {
                    write_stderr(store.as_context_mut(), bytes);
                }
                results[0] = ok(None);
                Ok(())
            },
        )?;
    }
    // Writes never wait: the stream is always ready.
    i.func_new(
        "[method]output-stream.subscribe",
        |mut store, _, params, results| {
            release_borrows(store.as_context_mut(), params)?;
            let ready = ResourceDynamic::new_own(0, POLLABLE);
            results[0] = Val::Resource(ready.try_into_resource_any(&mut store)?);
            Ok(())
        },
    )?;
    for method in ["flush", "blocking-flush"] {
        i.func_new(
            &format!("[method]output-stream.{method}"),
            move |store, _, params, results| {
                release_borrows(store, params)?;
                results[0] = ok(None);
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Ends the borrows a method received (`self`, a list of pollables): a host function given a
/// borrowed handle must give it back before it returns.
fn release_borrows(
    mut store: StoreContextMut<'_, HostState>,
    params: &[Val],
) -> wasmtime::Result<()> {
    for p in params {
        match p {
            Val::Resource(r) if !r.owned() => r.resource_drop(&mut store)?,
            Val::List(items) => {
                for item in items {
                    if let Val::Resource(r) = item {
                        if !r.owned() {
                            r.resource_drop(&mut store)?;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Pollables: the only ones are those of output streams, always ready.
fn define_poll(linker: &mut Linker<HostState>, name: &str) -> wasmtime::Result<()> {
    let mut i = linker.instance(name)?;
    i.func_new("[method]pollable.ready", |store, _, params, results| {
        release_borrows(store, params)?;
        results[0] = Val::Bool(true);
        Ok(())
    })?;
    i.func_new("[method]pollable.block", |store, _, params, _| {
        release_borrows(store, params)
    })?;
    i.func_new("poll", |store, _, params, results| {
        release_borrows(store, params)?;
        let n = match params.first() {
            Some(Val::List(items)) => items.len() as u32,
            _ => 0,
        };
        results[0] = Val::List((0..n).map(Val::U32).collect());
        Ok(())
    })
}

/// Takes bytes the guest wrote to stderr: with the grant, each complete line is logged.
fn write_stderr(mut store: StoreContextMut<'_, HostState>, bytes: &[Val]) {
    let state = store.data_mut();
    if !state.shared.stderr_to_log {
        return;
    }
    for b in bytes {
        let Val::U8(b) = b else { continue };
        if *b == b'\n' {
            let line = String::from_utf8_lossy(&state.stderr).into_owned();
            state.stderr.clear();
            tracing::warn!(
                target: "gateway::wasm_guardrail",
                plugin = state.shared.id.as_str(),
                stderr = truncate(&line, MAX_STDERR_LINE),
                "guardrail wrote to stderr"
            );
        } else if state.stderr.len() < MAX_STDERR_LINE {
            state.stderr.push(*b);
        }
    }
}
