//! How one step's Lua script is put together and called.
//!
//! A step's script is, in this order:
//! 1. `local STEP = '<step>'` and `MOVES`, the job's transition table
//!    generated from [`crate::job::lifecycle::MOVES`];
//!    and `TERMINAL`, the set of terminal statuses;
//! 2. `lib.lua`: the helpers every script shares, among them
//!    `set_status`, the only code that writes a job's `status` (it refuses
//!    a move `MOVES` does not give this step, and writes nothing then);
//! 3. the step's inputs bound to named locals: its keys as `<name>_key =
//!    KEYS[i]`, its arguments as `<name> = ARGV[i]`, in the one order of
//!    the step's inputs struct ([`script_inputs!`]), and `REST`, the index
//!    of the first variadic argument;
//! 4. the step's own `<step>.lua`.
//!
//! Every script answers an array whose first element names the outcome;
//! `{'refused', from, to}` (a move the table does not allow) becomes
//! [`StoreError::Refused`] here, for every step alike.

use std::marker::PhantomData;

use deadpool_redis::redis::{Script, ScriptInvocation};

use crate::job::lifecycle::{MOVES, Step, TERMINAL};
use crate::store::StoreError;

/// `storage.lua` (the storage account every script of a key's bytes
/// shares, the files' too), then `lib.lua`.
const LIBRARY: &str = concat!(include_str!("../storage.lua"), include_str!("lib.lua"));

/// A step's keys and arguments, in the order the script binds them.
pub(super) trait Inputs {
    /// The keys' names, in order: the script's `<name>_key` locals.
    const KEYS: &'static [&'static str];
    /// The arguments' names, in order: the script's locals.
    const ARGS: &'static [&'static str];
    /// Adds the keys, then the arguments, in that order.
    fn push(&self, invocation: &mut ScriptInvocation<'_>);
}

/// Declares a step's inputs struct and its [`Inputs`] impl from one list,
/// so the Rust fields, their order and the Lua locals cannot drift apart.
macro_rules! script_inputs {
    (
        $(#[$meta:meta])*
        struct $name:ident {
            keys { $($key:ident),* $(,)? }
            args { $($arg:ident : $ty:ty),* $(,)? }
        }
    ) => {
        $(#[$meta])*
        pub(super) struct $name {
            $(pub(super) $key: String,)*
            $(pub(super) $arg: $ty,)*
        }

        impl $crate::store::job::script::Inputs for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
            const ARGS: &'static [&'static str] = &[$(stringify!($arg)),*];
            fn push(&self, invocation: &mut deadpool_redis::redis::ScriptInvocation<'_>) {
                $(invocation.key(&self.$key);)*
                $(invocation.arg(&self.$arg);)*
            }
        }
    };
}
pub(super) use script_inputs;

/// The Lua table of the moves `MOVES` allows, by step, from-status ('-'
/// for a job that does not exist) and to-status.
pub(super) fn moves_table() -> String {
    let mut lua = String::from("local MOVES = {\n");
    for step in Step::ALL {
        lua.push_str(&format!("  {} = {{", step.name()));
        // One entry per from-status (a Lua table keeps the last of two).
        let mut froms: Vec<Option<crate::job::Status>> = Vec::new();
        for m in step.moves() {
            if !froms.contains(&m.from) {
                froms.push(m.from);
            }
        }
        for from in froms {
            let to: Vec<String> = step
                .moves()
                .filter(|m| m.from == from)
                .flat_map(|m| m.to.iter())
                .map(|s| format!("{} = true", s.as_str()))
                .collect();
            let from = from.map_or("-", |s| s.as_str());
            lua.push_str(&format!(" ['{from}'] = {{{}}},", to.join(", ")));
        }
        lua.push_str(" },\n");
    }
    lua.push_str("}\n");
    lua
}

/// The Lua set of the terminal statuses ([`TERMINAL`]).
fn terminal_table() -> String {
    let names: Vec<String> = TERMINAL
        .iter()
        .map(|s| format!("{} = true", s.as_str()))
        .collect();
    format!("local TERMINAL = {{{}}}\n", names.join(", "))
}

/// The whole source of `step`'s script with `body` and the inputs `I`.
pub(super) fn source<I: Inputs>(step: Step, body: &str) -> String {
    debug_assert!(MOVES.iter().all(|m| Step::ALL.contains(&m.step)));
    let mut lua = format!("local STEP = '{}'\n", step.name());
    lua.push_str(&moves_table());
    lua.push_str(&terminal_table());
    lua.push_str(LIBRARY);
    for (i, key) in I::KEYS.iter().enumerate() {
        lua.push_str(&format!("local {key}_key = KEYS[{}]\n", i + 1));
    }
    for (i, arg) in I::ARGS.iter().enumerate() {
        lua.push_str(&format!("local {arg} = ARGV[{}]\n", i + 1));
    }
    lua.push_str(&format!("local REST = {}\n", I::ARGS.len() + 1));
    lua.push_str(body);
    lua
}

/// One step's script, called with its inputs `I`.
pub(super) struct StepScript<I> {
    step: Step,
    script: Script,
    inputs: PhantomData<fn(&I)>,
}

impl<I> std::fmt::Debug for StepScript<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepScript")
            .field("step", &self.step)
            .finish()
    }
}

impl<I: Inputs> StepScript<I> {
    pub(super) fn new(step: Step, body: &str) -> Self {
        Self {
            step,
            script: Script::new(&source::<I>(step, body)),
            inputs: PhantomData,
        }
    }

    /// Runs the script with `inputs` and the variadic arguments `rest`;
    /// the reply's elements, the outcome first.
    pub(super) async fn run(
        &self,
        conn: &mut impl deadpool_redis::redis::aio::ConnectionLike,
        inputs: &I,
        rest: &[&[u8]],
    ) -> Result<Reply, StoreError> {
        let mut invocation = self.script.prepare_invoke();
        inputs.push(&mut invocation);
        for arg in rest {
            invocation.arg(*arg);
        }
        let parts: Vec<String> = invocation.invoke_async(conn).await?;
        Reply::new(self.step, parts)
    }
}

/// A script's answer: its outcome and the details after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) step: Step,
    pub(super) parts: Vec<String>,
}

impl Reply {
    fn new(step: Step, parts: Vec<String>) -> Result<Self, StoreError> {
        match parts.as_slice() {
            [refused, from, to] if refused == "refused" => Err(StoreError::Refused {
                step: step.name(),
                from: from.clone(),
                to: to.clone(),
            }),
            [] => Err(StoreError::UnexpectedReply {
                script: step.name(),
                reply: "an empty reply".to_string(),
            }),
            _ => Ok(Self { step, parts }),
        }
    }

    pub(super) fn outcome(&self) -> &str {
        &self.parts[0]
    }

    /// The `i`-th detail after the outcome ("" when there is none).
    pub(super) fn detail(&self, i: usize) -> &str {
        self.parts.get(i + 1).map_or("", String::as_str)
    }

    /// The `i`-th detail as a number.
    pub(super) fn number<T: std::str::FromStr>(&self, i: usize) -> Result<T, StoreError> {
        self.detail(i).parse().map_err(|_| self.unexpected())
    }

    /// This reply as one its script never gives.
    pub(super) fn unexpected(&self) -> StoreError {
        StoreError::UnexpectedReply {
            script: self.step.name(),
            reply: format!("{:?}", self.parts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    script_inputs! {
        struct Sample {
            keys { job, events }
            args { id: String, now: u64 }
        }
    }

    #[test]
    fn inputs_are_bound_to_named_locals_in_their_one_order() {
        let lua = source::<Sample>(Step::Finish, "return {'ok'}");
        let header = "local job_key = KEYS[1]\nlocal events_key = KEYS[2]\n\
                      local id = ARGV[1]\nlocal now = ARGV[2]\nlocal REST = 3\nreturn {'ok'}";
        assert!(lua.ends_with(header), "{lua}");
        assert!(lua.starts_with("local STEP = 'finish'\nlocal MOVES = {\n"));
    }

    #[test]
    fn the_lua_table_is_the_rust_table() {
        let lua = moves_table();
        assert!(
            lua.contains("  submit = { ['-'] = {queued = true}, },\n"),
            "{lua}"
        );
        assert!(
            lua.contains("  start = { ['queued'] = {running = true}, },\n"),
            "{lua}"
        );
        assert!(lua.contains("  release = { },\n"), "{lua}");
        assert!(
            lua.contains("['running'] = {queued = true, cancelled = true, error = true},"),
            "{lua}"
        );
        assert!(lua.contains(
            "['running'] = {succeeded = true, failed = true, timed_out = true, cancelled = true, error = true},"
        ));
    }

    #[test]
    fn only_set_status_writes_a_status() {
        for (name, body) in super::super::SCRIPT_BODIES {
            for line in body.lines() {
                assert!(
                    !(line.contains("HSET") && line.contains("'status'")),
                    "{name}.lua writes a status without set_status: {line}"
                );
            }
        }
        let writes: Vec<&str> = LIBRARY
            .lines()
            .filter(|l| l.contains("HSET") && l.contains("'status'"))
            .collect();
        assert_eq!(writes.len(), 1, "{writes:?}");
    }

    #[test]
    fn refusals_and_empty_replies_are_errors() {
        let refused = Reply::new(
            Step::Start,
            vec!["refused".into(), "succeeded".into(), "running".into()],
        );
        assert!(matches!(
            refused,
            Err(StoreError::Refused { step: "start", ref from, ref to }) if from == "succeeded" && to == "running"
        ));
        assert!(matches!(
            Reply::new(Step::Start, vec![]),
            Err(StoreError::UnexpectedReply {
                script: "start",
                ..
            })
        ));
    }
}
