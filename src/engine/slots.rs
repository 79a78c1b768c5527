//! Continuous batching (`deltafin serve`: 4 slots by default, `--parallel N`): several
//! requests decoded together.
//!
//! [`Slots`] holds N slots, each a KV cache (its share of the context, or with
//! [`SlotContext::Shared`] up to the whole context, the slots together holding at most it)
//! with the token ids it holds, kept after a request ends so that the next request sharing
//! its prefix prefills only the rest. A request joins a free slot between steps ([`Slots::admit`]: the free slot whose
//! tokens share the longest prefix with its prompt). Each [`Slots::step`] is one forward pass
//! over every running slot ([`crate::models::Model::forward_batch`]): one token of each
//! decoding slot, then chunks of the prefilling slots' prompts within the step's budget of
//! `n_batch` rows, first come first served, so a long prompt is prefilled over several steps
//! while the others keep decoding. A MoE layer reads the union of the slots' experts once.
//!
//! Each token goes through the same hand-out as a sequence alone ([`Handout`]: end of
//! generation, stop strings, `max_tokens`) and the same reply ([`Reply`]: logprobs, tool
//! calls), and a sequence's logits in a batch equal its logits alone bit for bit
//! (`tests/batch_pass.rs`), so a request's text is that of [`super::Engine::generate`] for the
//! same prompt and seed (`tests/serve_batch.rs`). Speculative decoding is not batched: the
//! server runs it one request at a time ([`super::Engine::generate`]).

use std::time::Instant;

use rayon::prelude::*;

use super::conversation::{Chunk, Outcome, Params, Reply};
use super::generate::{Handout, Output};
use super::sampler::Sampler;
use super::session::{Finish, Session};
use crate::models::{KvCache, Logits, SeqPass};
use crate::tokenizer::ModelTokenizer;

/// One request for a slot, with where its results go. `'a` is what the callbacks borrow.
pub struct Request<'a> {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling, stops, logprobs, tools.
    pub params: Params,
    /// Receives final text (and logprobs) in order.
    pub emit: Box<dyn FnMut(Chunk) + 'a>,
    /// Asked before every step: `true` ends the request there ([`super::FinishReason::Cancelled`]).
    pub cancelled: Box<dyn Fn() -> bool + 'a>,
    /// Called once at the end: how the request ended, or why it failed (the message for the
    /// client).
    pub done: Box<dyn FnOnce(Result<Outcome, String>) + 'a>,
}

/// A request in a slot.
struct Running<'a> {
    /// The tokens to prefill: the request's prompt, and after a preemption
    /// ([`Slots::preempt`]) the tokens it had generated too.
    prompt: Vec<u32>,
    /// The request's own prompt tokens (the first of `prompt`).
    prompt_len: usize,
    /// Prompt tokens in the slot's cache (those reused included).
    pos: usize,
    /// Prompt tokens reused from the slot's previous request.
    keep: usize,
    /// Admission order (first come, first served for prefill rows).
    order: u64,
    sampler: Sampler,
    hand: Handout,
    reply: Reply<'a>,
    cancelled: Box<dyn Fn() -> bool + 'a>,
    done: Box<dyn FnOnce(Result<Outcome, String>) + 'a>,
    /// Admission time, and the first token's.
    t0: Instant,
    first: Option<Instant>,
}

impl Running<'_> {
    fn prefilling(&self) -> bool {
        self.pos < self.prompt.len()
    }
}

/// One slot: its KV cache, the token ids the cache holds (once no request runs in it), the
/// request running in it, and when a request last started or ended in it ([`Slots`]'s clock:
/// the shared context gives up the least recently used idle slot's positions first).
struct Slot<'a> {
    cache: KvCache,
    cached: Vec<u32>,
    run: Option<Running<'a>>,
    used: u64,
}

/// N slots over one model (module header). `'a` is what the tokenizer and the requests'
/// callbacks borrow.
pub struct Slots<'a> {
    tok: &'a ModelTokenizer,
    slots: Vec<Slot<'a>>,
    /// Rows one step may take (the session's `n_batch`, at least the number of slots).
    rows: usize,
    admitted: u64,
    /// Ticks at every admission and every end: a slot's `used`.
    clock: u64,
    /// With a shared context ([`SlotContext::Shared`]): the positions all slots together may
    /// hold.
    pool: Option<usize>,
}

/// How `n` slots divide a context of `n_ctx` positions (`deltafin serve --parallel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotContext {
    /// Each slot has [`slot_ctx`]`(n_ctx, n)` positions of its own (llama-server's `-np N`).
    Split,
    /// One pool of `n_ctx` positions (llama-server's unified KV cache, `-kvu`, its default
    /// with 4 slots): a request may use the whole context while the others leave room; the
    /// slots' KV memory grows with the positions they hold. When a step needs more positions
    /// than are free, idle slots give up their cached prompts (least recently used first),
    /// a prompt waits until all of it fits beside the requests ahead of it (first come, first
    /// served: `Slots::choose`), and when the running requests alone fill the pool the most
    /// recently admitted one that holds positions is preempted (`Slots::preempt`: it gives
    /// them up and waits, to be prefilled again with the tokens it has generated and go on
    /// where it was, as vLLM preempts by recomputation). A request ends for the context
    /// (`finish_reason: "length"`) only when it fills the whole context alone.
    Shared,
}

/// The context of each of `n` slots sharing a KV cache of `n_ctx` positions: `n_ctx / n`
/// (llama-server's rule for `-np`), at least 2.
pub fn slot_ctx(n_ctx: usize, n: usize) -> usize {
    (n_ctx / n.max(1)).max(2)
}

/// The longest prompt-plus-reply one of `n` slots can hold with a context of `n_ctx`
/// positions divided as `how` says.
pub fn slot_ctx_for(n_ctx: usize, n: usize, how: SlotContext) -> usize {
    match how {
        SlotContext::Split => slot_ctx(n_ctx, n),
        SlotContext::Shared => n_ctx.max(2),
    }
}

/// The running slots in step order: `(prefilling, admission order, slot)`, decoding slots
/// first, then prompts first come first served.
fn step_order(slots: &[Slot]) -> Vec<(bool, u64, usize)> {
    let mut o: Vec<(bool, u64, usize)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.run.as_ref().map(|r| (r.prefilling(), r.order, i)))
        .collect();
    o.sort();
    o
}

impl<'a> Slots<'a> {
    /// `n` slots (at least 1) over `session`'s model, each with a KV cache of
    /// [`slot_ctx_for`]`(session.cache.n_ctx, n, how)` positions: one slot takes the
    /// session's cache and what it holds is forgotten; with more, the session's cache is given
    /// up for theirs (give it back with [`Slots::into_cache`]). `tok` detokenizes and tells
    /// end-of-generation tokens.
    pub fn new(session: &mut Session, tok: &'a ModelTokenizer, n: usize, how: SlotContext) -> Self {
        let n = n.max(1);
        let n_ctx = session.cache.n_ctx;
        let caches: Vec<KvCache> = if n == 1 {
            let mut c = std::mem::replace(&mut session.cache, session.model.new_cache(0));
            c.clear();
            vec![c]
        } else {
            let per = slot_ctx_for(n_ctx, n, how);
            session.cache = session.model.new_cache(0);
            (0..n).map(|_| session.model.new_cache(per)).collect()
        };
        Self {
            tok,
            slots: caches
                .into_iter()
                .map(|cache| Slot {
                    cache,
                    cached: Vec::new(),
                    run: None,
                    used: 0,
                })
                .collect(),
            rows: session.n_batch.max(n),
            admitted: 0,
            clock: 0,
            pool: (how == SlotContext::Shared && n > 1).then_some(n_ctx),
        }
    }

    /// Positions the slots hold now (running requests and idle slots' cached prompts).
    pub fn held(&self) -> usize {
        self.slots.iter().map(|s| s.cache.len).sum()
    }

    /// Positions the slots' host KV memory could hold now ([`KvCache::held_positions`]
    /// summed): with a shared context at most a quarter more than [`Slots::held`] (a
    /// sequence's growth), as slots that take a new request keep only its prefix's memory.
    pub fn memory_positions(&self) -> usize {
        self.slots.iter().map(|s| s.cache.held_positions()).sum()
    }

    /// With a shared context, frees positions for `want` more (at most what idle slots hold):
    /// idle slots give up their cached positions and memory, least recently used first.
    /// Returns the positions free then (`usize::MAX` with contexts of their own).
    fn make_room(&mut self, want: usize) -> usize {
        let Some(pool) = self.pool else {
            return usize::MAX;
        };
        loop {
            let free = pool.saturating_sub(self.held());
            if free >= want {
                return free;
            }
            let idle = self
                .slots
                .iter_mut()
                .filter(|s| s.run.is_none() && s.cache.len > 0)
                .min_by_key(|s| s.used);
            match idle {
                Some(s) => {
                    s.cache.release();
                    s.cached.clear();
                }
                None => return free,
            }
        }
    }

    /// Gives the first slot's cache back to `session` (its contents forgotten).
    pub fn into_cache(mut self, session: &mut Session) {
        let mut c = self.slots.swap_remove(0).cache;
        c.clear();
        session.cache = c;
    }

    /// Context of each slot in tokens.
    pub fn n_ctx(&self) -> usize {
        self.slots[0].cache.n_ctx
    }

    /// Requests running.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.run.is_some()).count()
    }

    /// Whether a slot is free.
    pub fn has_free(&self) -> bool {
        self.slots.iter().any(|s| s.run.is_none())
    }

    /// Starts `req` in the free slot whose cached tokens share the longest prefix with its
    /// prompt (that prefix, short of the prompt's last token, is not prefilled again). Its
    /// tokens come from the following [`Slots::step`]s.
    ///
    /// Errors (through `req.done`, at once): no slot is free; the prompt is empty or does not
    /// fit a slot's context with one more token.
    pub fn admit(&mut self, req: Request<'a>) {
        let n_ctx = self.n_ctx();
        let p = &req.prompt;
        let refuse = if p.is_empty() {
            Some("the prompt is empty".to_string())
        } else if p.len() + 1 > n_ctx {
            Some(format!(
                "the prompt has {} tokens but the context holds {n_ctx}",
                p.len()
            ))
        } else if !self.has_free() {
            Some("no slot is free".to_string())
        } else {
            None
        };
        if let Some(m) = refuse {
            return (req.done)(Err(m));
        }
        let shared = |s: &Slot| s.cached.iter().zip(p).take_while(|(a, b)| a == b).count();
        let slot = self
            .slots
            .iter_mut()
            .filter(|s| s.run.is_none())
            .max_by_key(|s| (shared(s), std::cmp::Reverse(s.cache.len)))
            .expect("a free slot");
        let keep = shared(slot).min(p.len() - 1);
        let keep = slot.cache.truncate(keep);
        slot.cached.truncate(keep);
        if self.pool.is_some() {
            // what a shared context counts is what the slot holds
            slot.cache.shrink_to_len();
        }
        self.admitted += 1;
        self.clock += 1;
        slot.used = self.clock;
        let tok = self.tok;
        slot.run = Some(Running {
            pos: keep,
            keep,
            order: self.admitted,
            sampler: Sampler::steered(req.params.sampler.clone(), req.params.steering.clone()),
            hand: Handout::new(p, &req.params.stop, req.params.max_tokens),
            reply: Reply::new(tok, &req.params, req.emit),
            cancelled: req.cancelled,
            done: req.done,
            t0: Instant::now(),
            first: None,
            prompt_len: req.prompt.len(),
            prompt: req.prompt,
        });
    }

    /// The rows of a step with `room` positions free (at least one per decoding slot) over
    /// the running slots in `order` ([`step_order`]): `(slot, tokens, whether they end its
    /// prompt)`. Each decoding slot's last token, then prompt chunks first come first served
    /// within the step's rows; a prompt gets rows only when the rest of it fits in the room
    /// left beside the requests ahead of it (a position for each decoding slot's next token,
    /// the rest of each earlier prompt and its first token), else it waits, and so do the
    /// prompts after it: a prompt is not prefilled into positions it would have to give back.
    fn choose(
        &self,
        order: &[(bool, u64, usize)],
        mut room: usize,
    ) -> Vec<(usize, Vec<u32>, bool)> {
        let mut left = self.rows;
        let mut ahead = order.iter().filter(|o| !o.0).count();
        let mut chosen = Vec::new();
        for &(prefilling, _, i) in order {
            let r = self.slots[i].run.as_ref().expect("running");
            if !prefilling {
                let last = *r.hand.history.last().expect("the first token was sampled");
                chosen.push((i, vec![last], true));
                left = left.saturating_sub(1);
                room -= 1;
                continue;
            }
            let rest = r.prompt.len() - r.pos;
            if left == 0 || room < rest.saturating_add(ahead) {
                break;
            }
            let n = rest.min(left);
            let end = r.pos + n;
            chosen.push((i, r.prompt[r.pos..end].to_vec(), end == r.prompt.len()));
            left -= n;
            room -= n;
            ahead += rest - n + 1;
        }
        chosen
    }

    /// Preempts the request in slot `i` (a shared context its positions must leave): the slot
    /// gives up its positions and memory, and the request waits as a prompt of its own prompt
    /// and the tokens it has generated (the last one sampled included), prefilled again when
    /// room frees; its next token is drawn from that prefill's logits, so its reply goes on
    /// where it was (the same text as without the preemption: a pass's rows are computed as
    /// they are alone, whatever the rows beside them). Ends it ([`Finish::ContextFull`])
    /// instead when those tokens and one more do not fit the context.
    fn preempt(&mut self, i: usize) {
        let n_ctx = self.n_ctx();
        let slot = &mut self.slots[i];
        let Some(r) = slot.run.as_mut() else {
            return;
        };
        if r.prompt_len + r.hand.tokens.len() + 1 > n_ctx {
            return self.end(i, Some(Finish::ContextFull));
        }
        r.prompt.truncate(r.prompt_len);
        r.prompt.extend_from_slice(&r.hand.tokens);
        r.pos = 0;
        slot.cache.release();
        slot.cached.clear();
    }

    /// One step: ends the requests whose `cancelled` says so, then runs one forward pass over
    /// the running slots (module header), samples the slots' tokens in parallel and hands
    /// them out in slot order. Returns the rows the pass took (0: nothing ran).
    ///
    /// A pass that fails ends every request in it with the error (their slots' caches are
    /// emptied).
    pub fn step(&mut self, session: &mut Session) -> usize {
        for i in 0..self.slots.len() {
            if self.slots[i].run.as_ref().is_some_and(|r| (r.cancelled)()) {
                self.end(i, Some(Finish::Interrupted));
            }
        }
        // decoding slots first, then prefill chunks first come first served; with a shared
        // context, when the running requests need more positions than are free, the newest
        // holding positions is preempted until they fit
        let mut chosen = loop {
            let order = step_order(&self.slots);
            let decoding = order.iter().filter(|o| !o.0).count();
            let prompts: usize = order
                .iter()
                .filter(|o| o.0)
                .filter_map(|o| self.slots[o.2].run.as_ref())
                .map(|r| r.prompt.len() - r.pos)
                .sum();
            let room = self.make_room(decoding + prompts);
            if room >= decoding {
                let chosen = self.choose(&order, room);
                // a step runs, or none can and no running request holds positions to give up
                if !chosen.is_empty() || order.iter().all(|o| self.slots[o.2].cache.len == 0) {
                    break chosen;
                }
            }
            // the newest holding positions (preempting a prompt that waits with none frees
            // none)
            let newest = order
                .iter()
                .filter(|o| self.slots[o.2].cache.len > 0)
                .max_by_key(|o| o.1)
                .expect("a running request holds positions")
                .2;
            self.preempt(newest);
        };
        if chosen.is_empty() {
            return 0;
        }
        chosen.sort_by_key(|c| c.0);
        let rows = chosen.iter().map(|c| c.1.len()).sum();
        let result = {
            let mut want = chosen.iter().peekable();
            let mut passes = Vec::with_capacity(chosen.len());
            for (i, s) in self.slots.iter_mut().enumerate() {
                if let Some((_, toks, _)) = want.next_if(|c| c.0 == i) {
                    passes.push(SeqPass::new(&mut s.cache, toks, Logits::Last));
                }
            }
            session.model.forward_batch(&mut session.store, &mut passes)
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("{e:#}");
                let shared = self.pool.is_some();
                for (i, _, _) in chosen {
                    let s = &mut self.slots[i];
                    if shared {
                        s.cache.release();
                    } else {
                        s.cache.clear();
                    }
                    s.cached.clear();
                    if let Some(r) = s.run.take() {
                        (r.done)(Err(msg.clone()));
                    }
                }
                return 0;
            }
        };
        // Which slots hand out a token: those whose step ended their prompt or decoded one,
        // unless their hand-out is already over (then they end unsampled: a grammar must
        // advance only over tokens handed out).
        let mut handed: Vec<(usize, bool, Vec<f32>)> = Vec::with_capacity(chosen.len());
        for ((i, toks, ends), l) in chosen.into_iter().zip(logits) {
            let r = self.slots[i].run.as_mut().expect("running");
            if r.prefilling() {
                r.pos += toks.len();
            }
            if ends {
                handed.push((i, !r.hand.done(), l));
            }
        }
        let drawn = self.sample(&mut handed);
        // the hand-out, in slot order
        let tok = self.tok;
        let is_eog = |t: u32| tok.is_eog(t);
        let mut drawn = drawn.into_iter();
        for (i, sampled, _) in handed {
            if !sampled {
                self.end(i, None);
                continue;
            }
            let (id, row) = drawn.next().expect("a draw per sampled slot");
            let slot = &mut self.slots[i];
            let r = slot.run.as_mut().expect("running");
            r.first.get_or_insert_with(Instant::now);
            if !r.hand.push(id, row.as_deref(), &is_eog, &mut r.reply) {
                self.end(i, None);
            } else if slot.cache.len >= slot.cache.n_ctx {
                self.end(i, Some(Finish::ContextFull));
            }
        }
        rows
    }

    /// Samples the next token of each slot of `handed` (`(slot, whether to sample, its
    /// logits)`, in slot order) marked to be sampled, on rayon's global pool when there are
    /// several: returns, in the same order, the token and the logprobs row (the logits as they
    /// came from the pass, when the reply wants rows). Each slot's [`Sampler`] is its own (its
    /// PRNG stream, its grammar) and `sample` reads nothing shared, so the tokens do not
    /// depend on the schedule. Takes the logits out of `handed`.
    fn sample(&mut self, handed: &mut [(usize, bool, Vec<f32>)]) -> Vec<(u32, Option<Vec<f32>>)> {
        let mut jobs: Vec<(&mut Sampler, &[u32], bool, Vec<f32>)> = Vec::new();
        debug_assert!(handed.windows(2).all(|w| w[0].0 < w[1].0));
        let mut want = handed.iter_mut().filter(|h| h.1).peekable();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(h) = want.next_if(|h| h.0 == i) {
                let r = s.run.as_mut().expect("running");
                let rows = r.reply.rows();
                jobs.push((
                    &mut r.sampler,
                    &r.hand.history,
                    rows,
                    std::mem::take(&mut h.2),
                ));
            }
        }
        debug_assert!(want.next().is_none(), "every slot to sample was found");
        let one = |(s, history, rows, mut l): (&mut Sampler, &[u32], bool, Vec<f32>)| {
            // the row is taken before the sampler's steering and penalty change the logits
            let row = rows.then(|| l.clone());
            (s.sample(&mut l, history), row)
        };
        if jobs.len() < 2 {
            jobs.into_iter().map(one).collect()
        } else {
            jobs.into_par_iter().map(one).collect()
        }
    }

    /// Ends the request in slot `i` (`ended`: why, unless its hand-out saw an end), reports it,
    /// and keeps the token ids the slot's cache holds for the next request.
    fn end(&mut self, i: usize, ended: Option<Finish>) {
        let slot = &mut self.slots[i];
        let Some(mut r) = slot.run.take() else {
            return;
        };
        // its conversation is the most recently used now (a long request that ends after a
        // short one admitted later keeps its cached prompt longer)
        self.clock += 1;
        slot.used = self.clock;
        let finish = r.hand.end(ended, &mut r.reply);
        let tool_calls = r.reply.finish();
        let held = slot.cache.len;
        let all = r.prompt[..r.prompt_len].iter().chain(&r.hand.tokens);
        slot.cached = all.copied().take(held).collect();
        let t_end = Instant::now();
        let first = r.first.unwrap_or(t_end);
        let o = Outcome {
            cached_tokens: r.keep,
            ttft_s: (first - r.t0).as_secs_f64(),
            decode_s: (t_end - first).as_secs_f64(),
            ..Outcome::of(&finish, tool_calls, r.prompt_len, r.hand.tokens.len())
        };
        (r.done)(Ok(o));
    }
}
