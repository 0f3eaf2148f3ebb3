//! Keeping a conversation's newest state where llama-server finds it (issue 47), on a host that
//! picks a slot by age alone (`--slot-prompt-similarity 0`) and has a RAM prompt cache.
//!
//! There, llama-server gives a task its least recently used idle slot, saves what that slot held to
//! RAM and loads the RAM state that best matches the prompt; as the task starts it copies every
//! other idle slot to RAM too. A conversation whose answer ended after the host's last task
//! started has its newest state only in its slot, and that slot is the most recently used: when
//! the conversation comes back before anything else starts there, it is given another slot and
//! finds in RAM only the state of a turn before, so its previous turn is prefilled again. A lone
//! conversation on a two-slot host does that every turn (real b11434, `scripts/stash-effect.py`:
//! 5,475 tokens prefilled over 6 turns, against 2,762 with a stash before each returning turn).
//!
//! So before a conversation's turn on such a host, when its own previous answer there ended after
//! crossbar last sent the host a request (`Holdings::launch`), crossbar first sends a stash
//! (`upstream::Side::stash`): a short prompt left to the host's choice of slot, whose start copies
//! the idle slots to RAM. The turn then finds its history whichever slot it is given. It costs the
//! turn a round trip (2.4 ms on average there) and the host about four tokens of prefill.
//! It fails quietly (the request goes on without it), and it never runs on a host that picks
//! slots by similarity (there a slot chosen by prompt is not reloaded from RAM, and the stash
//! would only evict it); a host that picks by age is never pinned (`Gateway::pinning`).

use crate::logfmt::val;
use crate::state::Gateway;

use super::plan::{LeaseUse, Plan};

/// Sends the stash before the request of `plan` when its conversation needs one (see the
/// module). Counts the request as sent either way.
pub(super) fn before(gw: &Gateway, plan: &Plan<'_>) {
    let host = plan.host;
    let conversation = plan
        .conversation()
        .filter(|_| plan.lease == LeaseUse::Reused);
    let unsaved = gw.holdings.launch(&host.name, plan.model(), conversation);
    if !unsaved || !gw.stashes(host) {
        return;
    }
    let stashed = gw.upstream.side().stash(host);
    gw.metrics
        .observe_stash(&host.name, stashed.as_ref().ok().copied());
    match stashed {
        Ok(tokens) => log::debug!("stashed idle slots host={} prompt_n={tokens}", host.name),
        Err(why) => log::info!("stash failed host={} err={}", val(&host.name), val(&why)),
    }
}
