#!/usr/bin/env python3
"""Independent float64 NumPy reference for rollflash-train's advantages and policy losses.

Written from the published definitions, in their own padded `[batch, length]` layout, without
sharing code (or layout) with the Rust crate:

  alibaba/ROLL  roll/utils/functionals.py        agg_loss, masked_mean/sum/var, masked_whiten,
                                                 compute_approx_kl, reward_norm,
                                                 compute_reinforce_return, compute_advantage
                roll/pipeline/rlvr/actor_worker.py     PPO / GSPO (importance_sampling=seq),
                                                       dual clip, kl loss, entropy, total loss
                roll/pipeline/rlvr/actor_pg_worker.py  vanilla, tis, topr, cispo, kimi15
                roll/utils/train_infer_corrections.py  IS weight and filters
  inclusionAI/AReaL  areal/utils/functional/functional.py  ppo_actor_loss_fn with
                                                 behav_imp_weight_cap (before the
                                                 rejection_sampling rewrite): decoupled PPO;
                                                 apply_rejection_sampling (mask / clamp)
  ROLL roll/pipeline/agentic/utils.py            compute_segment_masked_mean (segment level)
  DAPO (arXiv 2503.14476) eq. 13                 soft overlong punishment
  ROLL roll/utils/functionals.py RunningMoments  `running` reward_norm (updated before use)
  langfengQ/verl-agent gigpo/core_gigpo.py       GiGPO: episode_norm_reward, build_step_group,
                                                 step_norm_reward,
                                                 compute_step_discounted_returns, in its own
                                                 one-row-per-step layout with labelled
                                                 anchor observations
  verl  core_algos.compute_rloo_outcome_advantage; compute_policy_loss_gspo (GSPO-token)

Conventions that the Rust side documents and this reference mirrors:
  * stop-gradient: every `sg(x)` is evaluated at the *base* log-probs `lp0` while the loss is
    a function of the perturbed `lp`, so finite differences see exactly autograd's semantics;
  * the train-inference filters update the mask *before* any denominator is counted (ROLL's
    pipeline-level `apply_train_infer_correction_to_batch`);
  * ROLL's `+1e-8` in denominators is kept here (the Rust side leaves it out; the difference
    is ~1e-9 relative).

Gradients: by **central finite differences in float64** (h = 1e-6) of the loss w.r.t. each
token's log-prob, with a kink guard: the one-sided differences must agree, so no token sits
within h of a clip boundary.

Modes:
  generate   write scripts/reference_losses.json (inputs, configs in rollflash's serde
             form, losses, gradients) and print the advantage references as Rust arrays
  check      recompute everything and compare with the committed JSON
"""

import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "reference_losses.json")

# --------------------------------------------------------------------------------------------
# Inputs: 5 sequences packed into 15 tokens; sequence 4 has no valid token.
# --------------------------------------------------------------------------------------------

LENGTHS = [5, 1, 4, 3, 2]
MASK = [0, 1, 1, 1, 1,  1,  1, 1, 0, 1,  1, 1, 1,  0, 0]


def make_inputs():
    rng = np.random.default_rng(20260501)
    n = sum(LENGTHS)
    logp = -rng.uniform(0.1, 3.0, n)
    old = logp - rng.normal(0.0, 0.35, n)
    behav = old - rng.normal(0.0, 0.4, n)
    ref = logp - rng.normal(0.0, 0.3, n)
    entropy = rng.uniform(0.5, 2.0, n)
    adv = rng.normal(0.0, 1.0, n)
    # Token 3: negative advantage and ratio ~3.7, so the dual clip (c = 3) holds it.
    old[3] = logp[3] - 1.3
    adv[3] = -0.8
    # Masked tokens carry garbage-ish (but finite) values that must not matter.
    for t, m in enumerate(MASK):
        if not m:
            old[t] = logp[t] + 7.0
            adv[t] = 5.0
    scores = [1.0, 0.0, 0.5, -1.0, 0.0]
    offsets = list(np.cumsum([0] + LENGTHS[:-1]))
    return dict(
        logp=logp, old_logp=old, behav_logp=behav, ref_logp=ref, entropy=entropy, adv=adv,
        mask=np.array(MASK, dtype=np.float64), seq_offsets=[int(o) for o in offsets],
        seq_scores=scores,
    )


def pad(x, offsets, n):
    """Packed [n] -> padded [B, L] (zeros after each sequence's end)."""
    ends = list(offsets[1:]) + [n]
    L = max(e - s for s, e in zip(offsets, ends))
    out = np.zeros((len(offsets), L))
    for i, (s, e) in enumerate(zip(offsets, ends)):
        out[i, : e - s] = x[s:e]
    return out


def unpad(x, offsets, n):
    ends = list(offsets[1:]) + [n]
    return np.concatenate([x[i, : e - s] for i, (s, e) in enumerate(zip(offsets, ends))])


# --------------------------------------------------------------------------------------------
# ROLL's helpers (roll/utils/functionals.py), in NumPy.
# --------------------------------------------------------------------------------------------

def masked_mean(x, mask, axis=None):
    if axis is None:
        return (x * mask).sum() / (mask.sum() + 1e-8)
    s = mask.sum(axis=axis)
    return np.where(s > 0, (x * mask).sum(axis=axis) / (s + 1e-8), 0.0)


def masked_sum(x, mask, axis=None):
    if axis is None:
        return (x * mask).sum()
    return (x * mask).sum(axis=axis)


def agg_loss(loss_mat, mask, mode, norm_len=None):
    """ROLL agg_loss with batch_num_tokens / global_valid_samples counted from `mask`
    (floored at 1, as in Strategy._get_batch_num_tokens / _get_global_valid_samples)."""
    n_tokens = max(mask.sum(), 1.0)
    valid = (mask.sum(axis=-1) > 0).astype(np.float64)
    n_valid = max(valid.sum(), 1.0)
    if mode == "token_mean":
        return (loss_mat * mask).sum() / n_tokens
    if mode == "seq_mean_token_sum":
        return (masked_sum(loss_mat, mask, -1) * valid).sum() / (n_valid + 1e-8)
    if mode == "seq_mean_token_mean":
        return (masked_mean(loss_mat, mask, -1) * valid).sum() / (n_valid + 1e-8)
    if mode == "seq_mean_token_sum_norm":
        return (masked_sum(loss_mat, mask, -1) * valid).sum() / norm_len
    raise ValueError(mode)


def approx_kl(logp, base, mask, kind):
    if kind == "k1":
        v = logp - base
    elif kind == "abs":
        v = np.abs(logp - base)
    elif kind == "k2":
        v = 0.5 * (logp - base) ** 2
    elif kind == "k3":
        kl = base - logp
        v = np.clip(np.exp(kl) - kl - 1.0, -10.0, 10.0)
    else:
        raise ValueError(kind)
    return v * mask


def segment_mean(x, mask):
    """ROLL compute_segment_masked_mean: each run of consecutive 1s in a row of `mask`
    gets the mean of `x` over that run; 0 elsewhere."""
    out = np.zeros_like(x)
    for b in range(mask.shape[0]):
        row = mask[b]
        starts = [t for t in range(len(row)) if row[t] == 1 and (t == 0 or row[t - 1] == 0)]
        for s0 in starts:
            e = s0
            while e < len(row) and row[e] == 1:
                e += 1
            out[b, s0:e] = x[b, s0:e].mean()
    return out


def rejection_weight(rs, prox, behav, mask):
    """AReaL apply_rejection_sampling (2-D padded branch): the behaviour weight after
    masking or clamping, 0 where rejected or masked."""
    level = rs.get("level", "token")
    action = rs.get("action", "mask")
    metric_name = rs.get("metric", "ratio")
    agg = rs.get("agg", "mean")
    upper = rs.get("upper", 5.0)
    lower = rs.get("lower")
    lr = np.where(mask > 0, prox - behav, 0.0)
    if metric_name == "ratio":
        metric = np.exp(lr)
    elif metric_name == "kl_k1":
        metric = lr
    elif metric_name == "kl_k2":
        metric = lr ** 2 / 2.0
    else:
        metric = np.exp(-lr) - 1.0 + lr

    def bounds(m):
        ok = m <= upper
        return ok & (m >= lower) if lower is not None else ok

    w = np.exp(lr)
    lo = lower if lower is not None else 0.0
    in_b = np.ones_like(mask, dtype=bool)
    if level == "sequence":
        use_log = metric_name == "ratio"
        vals = lr if use_log else metric
        cnt = np.maximum(mask.sum(-1, keepdims=True), 1)
        masked = np.where(mask > 0, vals, 0.0)
        if use_log:
            w = np.exp(masked.sum(-1, keepdims=True) / cnt) * np.ones_like(lr)
        if agg == "sum":
            sa = masked.sum(-1, keepdims=True)
        elif agg == "mean":
            sa = masked.sum(-1, keepdims=True) / cnt
        else:
            sa = np.where(mask > 0, vals, -np.inf).max(-1, keepdims=True)
            sa = np.where(mask.sum(-1, keepdims=True) == 0, 0.0, sa)
        sm = np.exp(sa) if use_log else sa
        ok = bounds(sm) * np.ones_like(mask, dtype=bool)
        if action == "mask":
            in_b = ok
        else:
            w = np.where(~ok, np.clip(w, lo, upper), w)
    else:
        if action == "mask":
            in_b = bounds(metric)
        else:
            w = np.clip(w, lo, upper)
    keep = (mask > 0) & in_b
    return np.where(keep, w, 0.0)


def train_infer_correction(cfg, old, behav, mask):
    """ROLL compute_train_infer_correction (token / geometric / sequence)."""
    log_ratio = old - behav
    diff_tok = np.exp(old) - np.exp(behav)
    ones = np.ones_like(old)
    ratio = {
        "token": np.exp(log_ratio),
        "geometric": np.exp(masked_mean(log_ratio, mask, -1))[:, None] * ones,
        "sequence": np.exp(masked_sum(log_ratio, mask, -1))[:, None] * ones,
        "segment": np.exp(segment_mean(log_ratio, mask)),
    }
    diff = {
        "token": diff_tok,
        "geometric": masked_mean(diff_tok, mask, -1)[:, None] * ones,
        "sequence": masked_sum(diff_tok, mask, -1)[:, None] * ones,
        "segment": segment_mean(diff_tok, mask),
    }
    isw = cfg.get("is_weight")
    if isw is not None:
        w = ratio[isw.get("level", "token")]
        ub = isw.get("upper_bound", 1.2)
        if ub is not None:
            w = np.clip(w, 0.0, ub)
    else:
        w = np.ones_like(old)
    keep = np.ones_like(mask)
    for f in cfg.get("filters", []):
        lvl = f.get("level", "token")
        rr = f.get("ratio_range", [0.8, 1.2])
        if rr is not None:
            keep = keep * (ratio[lvl] >= rr[0]) * (ratio[lvl] <= rr[1])
        dr = f.get("diff_range")
        if dr is not None:
            keep = keep * (diff[lvl] >= dr[0]) * (diff[lvl] <= dr[1])
    return w, keep


# --------------------------------------------------------------------------------------------
# The losses. `lp` is the live log-prob, `lp0` the base point at which sg(.) is evaluated.
# --------------------------------------------------------------------------------------------

DEFAULTS = dict(
    pg_variant="ppo", loss_agg="seq_mean_token_mean", agg_norm_len=None, clip_low=0.2,
    clip_high=0.2, dual_clip=None, gspo_clip_low=3e-4, gspo_clip_high=4e-4,
    gspo_token_grad=False, tis_low=0.0, tis_high=1.0, topr_positive_weight=1.0,
    topr_negative_weight=1.0, cispo_clip_low=0.1, cispo_clip_high=0.1,
    cispo_unified_mask=False, kimi15_tau=0.1, behav_imp_weight_cap=5.0, correction={},
    kl_coef=0.0, kl_estimator="k3", entropy_coef=0.0,
)


def ppo_clip(ratio, A, lo, hi, c):
    """ROLL actor_worker: loss = -min(r A, clamp(r) A); dual clip -max(-loss, c A) for A<0."""
    surr1 = ratio * A
    surr2 = np.clip(ratio, 1.0 - lo, 1.0 + hi) * A
    loss = -np.minimum(surr1, surr2)
    if c is not None:
        dual = -np.maximum(-loss, c * A)
        loss = np.where(A < 0, dual, loss)
    return loss


def total_loss(lp, lp0, inp, cfg, with_terms=False):
    """The loss as a function of packed log-probs `lp` (sg(.) evaluated at `lp0`)."""
    c = dict(DEFAULTS)
    c.update(cfg)
    offs, n = inp["seq_offsets"], len(inp["logp"])
    P = lambda x: pad(np.asarray(x, dtype=np.float64), offs, n)  # noqa: E731
    logp, logp0 = P(lp), P(lp0)
    old, behav, ref, ent, A = (P(inp[k]) for k in
                               ("old_logp", "behav_logp", "ref_logp", "entropy", "adv"))
    base_mask = P(inp["mask"])
    # Masked positions are zero in every input (the Rust side's sanitising; ROLL has
    # advantages * mask and relies on the mask for the rest).
    old, behav, ref, A = (x * base_mask for x in (old, behav, ref, A))
    corr = c["correction"]
    is_w, keep = train_infer_correction(corr, old, behav, base_mask)
    mask = base_mask * keep
    logp, logp0 = logp * mask, logp0 * mask
    old, behav, ref, A = (x * mask for x in (old, behav, ref, A))

    ratio = np.exp(logp - old)
    ratio0 = np.exp(logp0 - old)
    v = c["pg_variant"]
    if v == "vanilla":
        pg = -logp * A
    elif v == "ppo":
        pg = ppo_clip(ratio, A, c["clip_low"], c["clip_high"], c["dual_clip"])
    elif v == "tis":
        pg = -np.clip(ratio0, c["tis_low"], c["tis_high"]) * A * logp
    elif v == "topr":
        if c.get("_scores") is not None:
            pos = (np.asarray(c["_scores"]) > 0).astype(np.float64)[:, None] * np.ones_like(A)
        else:
            pos = (A > 0).astype(np.float64)
        neg = 1.0 - pos
        positive_loss = -A * logp * pos
        negative_loss = -np.clip(ratio0, 0.0, 1.0) * A * logp * neg
        pg = c["topr_positive_weight"] * positive_loss + c["topr_negative_weight"] * negative_loss
    elif v == "cispo":
        lo, hi = 1.0 - c["cispo_clip_low"], 1.0 + c["cispo_clip_high"]
        clipped = np.clip(ratio0, lo, hi)
        if c["cispo_unified_mask"]:
            m = ~(((A > 0) & (ratio0 > hi)) | ((A < 0) & (ratio0 < lo)))
            pg = -clipped * A * logp * m
        else:
            pg = -clipped * A * logp
    elif v == "kimi15":
        pg = -A * logp + c["kimi15_tau"] * 0.5 * (logp - old) ** 2
    elif v == "gspo":
        if c["gspo_token_grad"]:
            # verl compute_policy_loss_gspo: log s_it = lp - sg(lp) + sg(mean log ratio)
            s0 = masked_mean(logp0 - old, mask, -1)[:, None]
            r = np.exp(logp - logp0 + s0)
        else:
            # ROLL actor_worker importance_sampling == "seq"
            r = np.exp(masked_mean(logp - old, mask, -1))[:, None] * np.ones_like(A)
        pg = ppo_clip(r, A, c["gspo_clip_low"], c["gspo_clip_high"], c["dual_clip"])
    elif v == "decoupled_ppo":
        # AReaL ppo_actor_loss_fn (proximal = old, behaviour = behav)
        lo, hi = c["clip_low"], c["clip_high"]
        pg1 = -A * ratio
        pg2 = -A * np.clip(ratio, 1.0 - lo, 1.0 + hi)
        pg = np.maximum(pg1, pg2)
        if c["dual_clip"] is not None:
            pg3 = np.sign(A) * c["dual_clip"] * A
            pg = np.minimum(pg, pg3)
        rs = c.get("rejection_sampling")
        if rs is None:
            w = np.exp(old - behav)
            cap = c["behav_imp_weight_cap"]
            bmask = (w <= cap) * mask if cap is not None else mask
            pg = pg * np.where(bmask > 0, w, 0.0)
        else:
            pg = pg * rejection_weight(rs, old, behav, mask)
    else:
        raise ValueError(v)

    if corr.get("is_weight") is not None:
        pg = pg * is_w
    mode = c["loss_agg"]
    norm_len = c["agg_norm_len"] or max(LENGTHS)
    pg_loss = agg_loss(pg, mask, mode, norm_len)
    total = pg_loss
    kl = agg_loss(approx_kl(logp, ref, mask, c["kl_estimator"]), mask, mode, norm_len)
    if c["kl_coef"] > 0:
        total = total + c["kl_coef"] * kl
    h = agg_loss(ent, mask, mode, norm_len)
    if c["entropy_coef"] > 0:
        total = total - c["entropy_coef"] * h
    if with_terms:
        return total, pg_loss
    return total


def fd_grad(inp, cfg, h=1e-6):
    lp0 = np.asarray(inp["logp"], dtype=np.float64)
    f0 = total_loss(lp0, lp0, inp, cfg)
    g = np.zeros_like(lp0)
    for t in range(len(lp0)):
        e = np.zeros_like(lp0)
        e[t] = h
        fp = total_loss(lp0 + e, lp0, inp, cfg)
        fm = total_loss(lp0 - e, lp0, inp, cfg)
        g[t] = (fp - fm) / (2 * h)
        fwd, bwd = (fp - f0) / h, (f0 - fm) / h
        if abs(fwd - bwd) > 1e-4 * (1.0 + abs(g[t])):
            raise SystemExit(f"kink within h of token {t} for {cfg}: {fwd} vs {bwd}")
    return g


AGGS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]

VARIANTS = {
    "vanilla": dict(pg_variant="vanilla"),
    "ppo": dict(pg_variant="ppo", clip_low=0.2, clip_high=0.28),
    "ppo_dual": dict(pg_variant="ppo", clip_low=0.2, clip_high=0.28, dual_clip=3.0),
    "tis": dict(pg_variant="tis", tis_low=0.0, tis_high=1.0),
    "topr": dict(pg_variant="topr", topr_negative_weight=0.7),
    "topr_scores": dict(pg_variant="topr", topr_positive_weight=1.3, _scores=True),
    "cispo": dict(pg_variant="cispo", cispo_clip_low=0.2, cispo_clip_high=0.28),
    "cispo_unified": dict(pg_variant="cispo", cispo_clip_low=0.2, cispo_clip_high=0.28,
                          cispo_unified_mask=True),
    "kimi15": dict(pg_variant="kimi15", kimi15_tau=0.3),
    "gspo": dict(pg_variant="gspo", gspo_clip_low=0.1, gspo_clip_high=0.15, dual_clip=3.0),
    "gspo_token": dict(pg_variant="gspo", gspo_clip_low=0.1, gspo_clip_high=0.15,
                       gspo_token_grad=True),
    "decoupled_ppo": dict(pg_variant="decoupled_ppo", clip_low=0.2, clip_high=0.28,
                          dual_clip=3.0, behav_imp_weight_cap=1.5),
}

EXTRA = {
    "ppo_corr_token": dict(pg_variant="ppo", correction=dict(
        is_weight=dict(level="token", upper_bound=1.2))),
    "ppo_corr_geometric_filter": dict(pg_variant="ppo", loss_agg="token_mean", correction=dict(
        is_weight=dict(level="geometric", upper_bound=1.5),
        filters=[dict(level="token", ratio_range=[0.6, 1.6])])),
    "cispo_corr_sequence_diff": dict(pg_variant="cispo", correction=dict(
        is_weight=dict(level="sequence", upper_bound=None),
        filters=[dict(level="geometric", ratio_range=None, diff_range=[-0.05, 0.05])])),
    "kimi15_corr_seqsum_filter": dict(pg_variant="kimi15", loss_agg="seq_mean_token_sum",
                                      correction=dict(
        is_weight=dict(level="token", upper_bound=2.0),
        filters=[dict(level="sequence", ratio_range=[0.6, 3.0])])),
    "ppo_kl_k1_entropy": dict(pg_variant="ppo", kl_coef=0.1, kl_estimator="k1",
                              entropy_coef=0.01),
    "ppo_kl_k2": dict(pg_variant="ppo", loss_agg="token_mean", kl_coef=0.2, kl_estimator="k2"),
    "tis_kl_k3": dict(pg_variant="tis", kl_coef=0.05, kl_estimator="k3"),
    "vanilla_kl_abs": dict(pg_variant="vanilla", kl_coef=0.3, kl_estimator="abs",
                           entropy_coef=0.02),
    "ppo_sum_norm_len8": dict(pg_variant="ppo", loss_agg="seq_mean_token_sum_norm",
                              agg_norm_len=8),
    "decoupled_nocap_token_mean": dict(pg_variant="decoupled_ppo", loss_agg="token_mean",
                                       behav_imp_weight_cap=None),
    # Segment-level (per-turn) correction: sequence 2 has two segments (mask 1 1 0 1).
    "ppo_corr_segment": dict(pg_variant="ppo", correction=dict(
        is_weight=dict(level="segment", upper_bound=1.5))),
    "ppo_corr_segment_filter": dict(pg_variant="ppo", loss_agg="token_mean", correction=dict(
        filters=[dict(level="segment", ratio_range=[0.7, 1.6],
                      diff_range=[-0.15, 0.15])])),
    # AReaL rejection sampling (replaces the cap).
    "decoupled_rs_token_mask": dict(pg_variant="decoupled_ppo", loss_agg="token_mean",
                                    rejection_sampling=dict(upper=1.5, lower=0.6)),
    "decoupled_rs_token_clamp": dict(pg_variant="decoupled_ppo", loss_agg="token_mean",
                                     rejection_sampling=dict(action="clamp", upper=1.5,
                                                             lower=0.6)),
    "decoupled_rs_seq_mask": dict(pg_variant="decoupled_ppo", rejection_sampling=dict(
        level="sequence", upper=1.3)),
    "decoupled_rs_seq_clamp_sum": dict(pg_variant="decoupled_ppo", rejection_sampling=dict(
        level="sequence", action="clamp", agg="sum", upper=1.3, lower=0.8)),
    "decoupled_rs_seq_k3_max": dict(pg_variant="decoupled_ppo", loss_agg="seq_mean_token_sum",
                                    rejection_sampling=dict(level="sequence", metric="kl_k3",
                                                            agg="max", upper=0.2)),
    "decoupled_rs_token_k1": dict(pg_variant="decoupled_ppo", dual_clip=3.0,
                                  rejection_sampling=dict(metric="kl_k1", upper=0.3,
                                                          lower=-0.3)),
}


def cases(inp):
    out = []
    all_cases = [(f"{v}/{a}", dict(cfg, loss_agg=a)) for v, cfg in VARIANTS.items() for a in AGGS]
    all_cases += list(EXTRA.items())
    for name, cfg in all_cases:
        cfg = dict(cfg)
        uses_scores = cfg.pop("_scores", False)
        run_cfg = dict(cfg, _scores=inp["seq_scores"] if uses_scores else None)
        lp = np.asarray(inp["logp"], dtype=np.float64)
        loss, pg = total_loss(lp, lp, inp, run_cfg, with_terms=True)
        grad = fd_grad(inp, run_cfg)
        out.append(dict(name=name, config=cfg, use_scores=uses_scores, loss=float(loss),
                        pg_loss=float(pg), grad=[float(g) for g in grad]))
    return out


# --------------------------------------------------------------------------------------------
# Advantages.
# --------------------------------------------------------------------------------------------

ADV_REWARDS = [1.0, 0.0, 0.5, 2.0, 0.3, 0.3, 0.3, -1.0, 4.0]
ADV_GROUPS = [3, 1, 3, 2]
ADV_LENGTHS = [3, 2, 4, 1, 2, 3, 2, 2, 3]
ADV_MASK = [1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
ADV_KL = [0.05, -0.02, 0.1, 0.0, 0.3, 9.0, 0.2, -0.1, 0.05, 0.4, 0.01, 0.02, 9.0, 0.03, 0.1,
          0.2, 0.3, -0.05, 0.0, 0.15, 0.05, 9.0]


def grpo(rewards, groups, norm_by_std=True, eps=1e-6):
    out, at = [], 0
    for g in groups:
        r = np.asarray(rewards[at:at + g])
        if g < 2:
            out += [0.0] * g
        else:
            d = r - r.mean()
            out += list(d / (r.std(ddof=1) + eps) if norm_by_std else d)
        at += g
    return out


def rloo(rewards, groups):
    out, at = [], 0
    for g in groups:
        r = np.asarray(rewards[at:at + g])
        out += [0.0] * g if g < 2 else list(r * g / (g - 1) - r.mean() * g / (g - 1))
        at += g
    return out


def broadcast(seq_values, lengths, mask):
    tok = np.concatenate([[v] * l for v, l in zip(seq_values, lengths)])
    return list(tok * np.asarray(mask))


def reinforce_pp(rewards, groups, lengths, mask, kl, gamma, kl_coef, baseline, whiten,
                 eps=1e-8):
    """ROLL: response reward at the last valid token, - beta * kld, compute_reinforce_return,
    masked_whiten (unbiased var, rsqrt(var + 1e-8)), * mask."""
    r = np.asarray(rewards, dtype=np.float64)
    if baseline:
        at = 0
        for g in groups:
            r[at:at + g] -= r[at:at + g].mean()
            at += g
    offs = list(np.cumsum([0] + lengths[:-1]))
    n = sum(lengths)
    m = pad(np.asarray(mask, dtype=np.float64), offs, n)
    k = pad(np.asarray(kl, dtype=np.float64), offs, n)
    tok = -kl_coef * k * m
    for i in range(len(lengths)):
        valid = np.nonzero(m[i])[0]
        if len(valid):
            tok[i, valid[-1]] += r[i]
    ret = np.zeros_like(tok)
    g_acc = np.zeros(tok.shape[0])
    for t in reversed(range(tok.shape[1])):
        g_acc = tok[:, t] + gamma * g_acc
        ret[:, t] = g_acc
    if whiten and m.sum() > 1:
        mean = masked_mean(ret, m)
        var = masked_mean((ret - mean) ** 2, m) * m.sum() / (m.sum() - 1)
        ret = (ret - mean) / np.sqrt(var + eps)
    return list(unpad(ret * m, offs, n))


def advantages():
    m = [bool(x) for x in ADV_MASK]
    return {
        "grpo": broadcast(grpo(ADV_REWARDS, ADV_GROUPS), ADV_LENGTHS, m),
        "grpo_no_std": broadcast(grpo(ADV_REWARDS, ADV_GROUPS, False), ADV_LENGTHS, m),
        "rloo": broadcast(rloo(ADV_REWARDS, ADV_GROUPS), ADV_LENGTHS, m),
        "rpp": reinforce_pp(ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL, 1.0, 0.0, False,
                            True),
        "rpp_kl": reinforce_pp(ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL, 1.0, 0.1,
                               False, True),
        "rpp_baseline_gamma": reinforce_pp(ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL,
                                           0.9, 0.1, True, True),
        "rpp_raw": reinforce_pp(ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL, 1.0, 0.1,
                                False, False),
    }


# --------------------------------------------------------------------------------------------
# Reward and advantage shaping (ROLL reward_norm, reward_clip, compute_token_reward's clip,
# whiten_advantages, advantage_clip; DAPO's soft overlong punishment).
# --------------------------------------------------------------------------------------------

def overlong(length, max_len, cache_len, factor):
    """DAPO eq. 13 (times verl's penalty_factor)."""
    if length <= max_len - cache_len:
        return 0.0
    if length <= max_len:
        return ((max_len - cache_len) - length) / cache_len * factor
    return -1.0 * factor


def reward_norm(rewards, groups, mean_type, std_type, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    gid = np.repeat(np.arange(len(groups)), groups)
    out = np.zeros_like(r)
    for i in range(len(r)):
        g = r[gid == gid[i]]
        mu = {"none": 0.0, "group": g.mean(), "batch": r.mean()}[mean_type]
        if std_type == "none":
            out[i] = r[i] - mu
            continue
        pool = g if std_type == "group" else r
        if len(pool) < 2:
            out[i] = 0.0  # undefined std (ROLL's agentic_reward_norm gives 0)
        else:
            out[i] = (r[i] - mu) / (pool.std(ddof=1) + eps)
    return out


def whiten_tokens(values, mask):
    v = np.asarray(values, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)
    if m.sum() < 2:
        return v * m
    mean = (v * m).sum() / m.sum()
    var = ((v - mean) ** 2 * m).sum() / (m.sum() - 1)
    return (v - mean) / np.sqrt(var + 1e-8) * m


def rpp_clipped(rewards, lengths, mask, kl, gamma, kl_coef, clip):
    """REINFORCE++ returns with ROLL's token-level reward clip (no whitening here)."""
    offs = list(np.cumsum([0] + lengths[:-1]))
    n = sum(lengths)
    m = pad(np.asarray(mask, dtype=np.float64), offs, n)
    k = pad(np.asarray(kl, dtype=np.float64), offs, n)
    tok = -kl_coef * k * m
    for i in range(len(lengths)):
        valid = np.nonzero(m[i])[0]
        if len(valid):
            tok[i, valid[-1]] += rewards[i]
    if clip is not None:
        tok = np.clip(tok, -clip, clip)
    ret = np.zeros_like(tok)
    acc = np.zeros(tok.shape[0])
    for t in reversed(range(tok.shape[1])):
        acc = tok[:, t] + gamma * acc
        ret[:, t] = acc
    return list(unpad(ret * m, offs, n))


SHAPING_CASES = {
    "rpp_group_group": (dict(name="reinforce_plus_plus", whiten=False),
                        dict(norm_mean_type="group", norm_std_type="group")),
    "roll_reinforce_pp": (dict(name="reinforce_plus_plus", whiten=False, kl_coef=0.1),
                          dict(norm_mean_type="batch", norm_std_type="batch", reward_clip=1.2,
                               advantage_clip=1.0)),
    "lite_ppo": (dict(name="reinforce_plus_plus", whiten=False),
                 dict(norm_mean_type="group", norm_std_type="batch")),
    "grpo_whiten_clip": (dict(name="grpo"), dict(whiten_advantages=True, advantage_clip=1.1)),
    "rloo_whiten": (dict(name="rloo"), dict(whiten_advantages=True)),
    "dr_grpo_overlong": (dict(name="grpo", norm_by_std=False),
                         dict(overlong=dict(max_len=3, cache_len=2, penalty_factor=0.5))),
    "std_only_clip": (dict(name="reinforce_plus_plus", whiten=False),
                      dict(norm_std_type="group", reward_clip=0.5)),
    "batch_mean_only": (dict(name="grpo", norm_by_std=False), dict(norm_mean_type="batch")),
    "rpp_whiten_twice": (dict(name="reinforce_plus_plus", gamma=0.9, baseline=True),
                         dict(norm_std_type="batch", whiten_advantages=True)),
    # ROLL's reward_postprocess order with the group estimators too: normalise, *then* clip
    # the normalised reward, then the estimator (clip first would give other advantages;
    # `shaping_cases` checks that these cases tell the two orders apart).
    "grpo_batch_norm_clip": (dict(name="grpo"),
                             dict(norm_mean_type="batch", norm_std_type="batch",
                                  reward_clip=0.8)),
    "grpo_group_mean_batch_std_clip": (dict(name="grpo", norm_by_std=False),
                                       dict(norm_mean_type="group", norm_std_type="batch",
                                            reward_clip=0.7)),
    "rloo_group_norm_clip": (dict(name="rloo"),
                             dict(norm_mean_type="group", norm_std_type="group",
                                  reward_clip=0.9)),
}

# The cases above whose order of normalising and clipping is checked to matter.
ORDER_CASES = ["grpo_batch_norm_clip", "grpo_group_mean_batch_std_clip", "rloo_group_norm_clip"]


def shaped(estimator, shaping, rewards, groups, lengths, mask, kl):
    r = np.asarray(rewards, dtype=np.float64)
    ov = shaping.get("overlong")
    if ov is not None:
        offs = np.cumsum([0] + lengths[:-1])
        lens = [int(sum(mask[o:o + l])) for o, l in zip(offs, lengths)]
        r = r + np.array([overlong(x, ov["max_len"], ov.get("cache_len", ov["max_len"] // 5),
                                   ov.get("penalty_factor", 1.0)) for x in lens])
    r = reward_norm(r, groups, shaping.get("norm_mean_type", "none"),
                    shaping.get("norm_std_type", "none"), shaping.get("norm_eps", 1e-6))
    clip = shaping.get("reward_clip")
    if clip is not None:
        r = np.clip(r, -clip, clip)
    name = estimator["name"]
    if name == "grpo":
        adv = broadcast(grpo(list(r), groups, estimator.get("norm_by_std", True)), lengths,
                        mask)
    elif name == "rloo":
        adv = broadcast(rloo(list(r), groups), lengths, mask)
    else:
        rr = r.copy()
        if estimator.get("baseline", False):
            at = 0
            for g in groups:
                rr[at:at + g] -= rr[at:at + g].mean()
                at += g
        adv = rpp_clipped(rr, lengths, mask, kl, estimator.get("gamma", 1.0),
                          estimator.get("kl_coef", 0.0), clip)
        if estimator.get("whiten", True):
            adv = list(whiten_tokens(adv, mask))
    adv = np.asarray(adv, dtype=np.float64)
    if shaping.get("whiten_advantages", False):
        adv = whiten_tokens(adv, mask)
    aclip = shaping.get("advantage_clip")
    if aclip is not None:
        adv = np.clip(adv, -aclip, aclip)
    return [float(a) for a in adv * np.asarray(mask, dtype=np.float64)]


def clipped_first(estimator, shaping, rewards, groups, lengths, mask, kl):
    """The same shaping with the clip moved before the normalisation (the wrong order)."""
    clip = shaping["reward_clip"]
    r = list(np.clip(np.asarray(rewards, dtype=np.float64), -clip, clip))
    rest = {k: v for k, v in shaping.items() if k != "reward_clip"}
    return shaped(estimator, rest, r, groups, lengths, mask, kl)


def shaping_cases():
    m = [bool(x) for x in ADV_MASK]
    out = []
    for name, (est, sh) in SHAPING_CASES.items():
        adv = shaped(est, sh, ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL)
        if name in ORDER_CASES:
            other = clipped_first(est, sh, ADV_REWARDS, ADV_GROUPS, ADV_LENGTHS, m, ADV_KL)
            assert max(abs(a - b) for a, b in zip(adv, other)) > 1e-3, name
        out.append(dict(name=name, estimator=est, shaping=sh, advantages=adv))
    return dict(rewards=ADV_REWARDS, group_sizes=ADV_GROUPS, lengths=ADV_LENGTHS,
                mask=ADV_MASK, kl=ADV_KL, cases=out)


# --------------------------------------------------------------------------------------------
# ROLL's `running` reward normalisation: RunningMoments (roll/utils/functionals.py) updated
# with the batch *before* reward_norm reads running.mean / running.std.
# --------------------------------------------------------------------------------------------

class RunningMoments:
    """ROLL's RunningMoments, in float64 (ROLL: float32 tensors)."""

    def __init__(self):
        self.mean, self.std, self.var, self.count = 0.0, 1.0, 1.0, 1e-24

    def update(self, xs):
        xs = np.asarray(xs, dtype=np.float64)
        xs_count = xs.size
        xs_var, xs_mean = xs.var(ddof=0), xs.mean()  # torch.var_mean(unbiased=False)
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        new_sum = xs_var * xs_count
        old_sum = self.var * self.count + delta ** 2 * self.count * xs_count / tot_count
        tot_sum = old_sum + new_sum
        self.mean += delta * xs_count / tot_count
        self.var = tot_sum / tot_count
        with np.errstate(divide="ignore"):
            self.std = float(np.sqrt(np.float64(self.var * tot_count) / np.float64(tot_count - 1)))
        self.count = tot_count


def reward_norm_running(rewards, groups, mean_type, std_type, running, eps=1e-6):
    """ROLL reward_norm with running statistics: update first, then normalise. Group / batch
    scopes as in reward_norm above (one-sample std -> 0)."""
    r = np.asarray(rewards, dtype=np.float64)
    if "running" in (mean_type, std_type):
        running.update(r)
    gid = np.repeat(np.arange(len(groups)), groups)
    out = np.zeros_like(r)
    for i in range(len(r)):
        g = r[gid == gid[i]]
        mu = {"none": 0.0, "group": g.mean(), "batch": r.mean(), "running": running.mean}[
            mean_type]
        if std_type == "none":
            out[i] = r[i] - mu
            continue
        if std_type == "running":
            sd = running.std
        else:
            pool = g if std_type == "group" else r
            if len(pool) < 2:
                out[i] = 0.0
                continue
            sd = pool.std(ddof=1)
        out[i] = (r[i] - mu) / (sd + eps)  # an infinite running std gives 0, as in ROLL
    return out


RUNNING_STREAM = [
    dict(rewards=[1.0, 0.0, 0.5, -1.0, 0.0, 2.0], group_sizes=[3, 3]),
    dict(rewards=[0.25, 0.25, 1.5, -0.5], group_sizes=[2, 2]),
    dict(rewards=[3.0, -2.0, 0.0, 0.0, 1.0], group_sizes=[2, 1, 2]),
]

RUNNING_CASES = {
    "running_running": (RUNNING_STREAM, dict(norm_mean_type="running",
                                             norm_std_type="running")),
    "running_mean_group_std": (RUNNING_STREAM, dict(norm_mean_type="running",
                                                    norm_std_type="group")),
    "group_mean_running_std_clip": (RUNNING_STREAM, dict(norm_mean_type="group",
                                                         norm_std_type="running",
                                                         reward_clip=1.5)),
    "running_std_only": (RUNNING_STREAM, dict(norm_std_type="running")),
    "running_mean_only": (RUNNING_STREAM, dict(norm_mean_type="running")),
    # A first batch of one sample: the running std is infinite, the reward 0.
    "one_sample_first": ([dict(rewards=[2.0], group_sizes=[1]),
                          dict(rewards=[1.0, 3.0, -1.0], group_sizes=[3])],
                         dict(norm_mean_type="running", norm_std_type="running")),
}


def running_cases():
    out = []
    for name, (stream, sh) in RUNNING_CASES.items():
        rm = RunningMoments()
        steps, seen = [], []
        for b in stream:
            r = reward_norm_running(b["rewards"], b["group_sizes"],
                                    sh.get("norm_mean_type", "none"),
                                    sh.get("norm_std_type", "none"), rm)
            if sh.get("reward_clip") is not None:
                r = np.clip(r, -sh["reward_clip"], sh["reward_clip"])
            seen += b["rewards"]
            # The merge is the closed form over everything seen (the 1e-24 prior aside).
            assert abs(rm.mean - np.mean(seen)) < 1e-12
            if len(seen) > 1:
                assert abs(rm.std - np.std(seen, ddof=1)) < 1e-12
            steps.append(dict(rewards=b["rewards"], group_sizes=b["group_sizes"],
                              normalized=[float(x) for x in r],
                              mean=float(rm.mean), var=float(rm.var), count=float(rm.count),
                              std=(float(rm.std) if np.isfinite(rm.std) else None)))
        out.append(dict(name=name, shaping=sh, steps=steps))
    return out


# --------------------------------------------------------------------------------------------
# GiGPO (verl-agent gigpo/core_gigpo.py), in verl-agent's layout: one row per environment step
# with its prompt-group uid (`index`), trajectory uid, anchor observation (a label here) and
# step reward; every row carries its episode's reward (EpisodeRewardManager). The packed token
# layout the Rust side reads is built from the same description afterwards, each observation
# label spelled as its own token ids; the Rust side must recover the anchors from the tokens.
# --------------------------------------------------------------------------------------------

OBS_TOKENS = {"s0": [10, 11], "s1": [12], "s2": [13, 14, 15], "s3": [16], "s4": [17, 18]}

# Groups of trajectories; a trajectory is a list of turns (anchor label, action tokens, step
# reward). The first turn's anchor is the group's prompt ("p<g>").
GIGPO_GROUPS = [
    [  # group 0: shared and revisited states, one trajectory with no turn at all
        [("p0", 2, 0.0), ("s1", 1, 0.0), ("s2", 3, 1.0)],
        [("p0", 1, -0.1), ("s1", 2, 0.0), ("s1", 1, 0.5)],
        [("p0", 3, 0.0), ("s3", 2, 0.0)],
        [],
    ],
    [  # group 1: "s1" again, which must not join group 0's s1 turns
        [("p1", 2, 0.0), ("s1", 2, 1.0)],
        [("p1", 1, 0.0), ("s4", 1, 0.0), ("s1", 2, 0.0), ("s0", 1, 2.0)],
    ],
    [  # group 2: a single trajectory with a single turn (episode mean 0, std 1)
        [("p2", 2, 0.7)],
    ],
    [  # group 3: two identical one-turn trajectories (zero variance)
        [("p3", 1, 1.0)],
        [("p3", 2, 1.0)],
    ],
]

GIGPO_CASES = {
    "gigpo_default": (dict(name="gigpo"), {}),
    "gigpo_mean_std": (dict(name="gigpo", mode="mean_std_norm"), {}),
    "gigpo_gamma_half_w": (dict(name="gigpo", gamma=0.5, step_advantage_w=0.5), {}),
    "gigpo_gamma_one_std": (dict(name="gigpo", gamma=1.0, mode="mean_std_norm", eps=1e-3),
                            {}),
    # Through the shaping pipeline: whitened, then clipped (ROLL's GiGPO example whitens and
    # clips at 0.2; 1.5 here so the clip moves only some tokens).
    "gigpo_whiten_clip": (dict(name="gigpo"),
                          dict(whiten_advantages=True, advantage_clip=1.5)),
}


def gigpo_rows():
    rows = []  # (index, traj_uid, anchor, step reward)
    traj = 0
    for g, group in enumerate(GIGPO_GROUPS):
        for turns in group:
            for (anchor, _, r) in turns:
                rows.append((g, traj, anchor, r))
            traj += 1
    return rows


def gigpo_row_advantages(gamma, w, mode, eps):
    rows = gigpo_rows()
    index = [r[0] for r in rows]
    traj_uid = [r[1] for r in rows]
    anchor = [r[2] for r in rows]
    rewards = np.array([r[3] for r in rows], dtype=np.float64)
    # episode_rewards on every row
    ep = {}
    for t, r in zip(traj_uid, rewards):
        ep[t] = ep.get(t, 0.0) + r
    scores = np.array([ep[t] for t in traj_uid])
    remove_std = {"mean_norm": True, "mean_std_norm": False}[mode]
    # compute_step_discounted_returns
    step_ret = np.zeros_like(rewards)
    for t in set(traj_uid):
        idx = [i for i in range(len(rows)) if traj_uid[i] == t]
        run = 0.0
        for i in reversed(idx):
            run = rewards[i] + gamma * run
            step_ret[i] = run
    # episode_norm_reward (compute_mean_std_cross_steps=True: every row counts)
    ep_adv = np.zeros_like(scores)
    for g in set(index):
        idx = [i for i in range(len(rows)) if index[i] == g]
        vals = scores[idx]
        mean, std = (0.0, 1.0) if len(vals) == 1 else (vals.mean(), vals.std(ddof=1))
        for i in idx:
            ep_adv[i] = scores[i] - mean if remove_std else (scores[i] - mean) / (std + eps)
    # build_step_group: equal anchors within one index
    uid = [None] * len(rows)
    for g in set(index):
        for i in range(len(rows)):
            if index[i] == g:
                uid[i] = (g, anchor[i])
    # step_norm_reward
    st_adv = np.zeros_like(step_ret)
    for u in set(uid):
        idx = [i for i in range(len(rows)) if uid[i] == u]
        vals = step_ret[idx]
        mean = vals.mean()
        std = 1.0 if len(vals) == 1 else vals.std(ddof=1)
        for i in idx:
            st_adv[i] = step_ret[i] - mean if remove_std else (step_ret[i] - mean) / (std + eps)
    return ep_adv + w * st_adv


def gigpo_batch():
    """The packed sequences: prompt tokens, then per turn its action tokens (mask 1) and the
    next turn's observation tokens (mask 0)."""
    seqs = []
    action_tok = 100
    for g, group in enumerate(GIGPO_GROUPS):
        prompt = [1, 2, 3 + g]
        for turns in group:
            tokens, mask = list(prompt), [0] * len(prompt)
            lengths, step_rewards = [], []
            for k, (_, n_act, r) in enumerate(turns):
                if k > 0:
                    obs = OBS_TOKENS[turns[k][0]]
                    tokens += obs
                    mask += [0] * len(obs)
                tokens += list(range(action_tok, action_tok + n_act))
                action_tok += n_act
                mask += [1] * n_act
                lengths.append(n_act)
                step_rewards.append(r)
            seqs.append(dict(tokens=tokens, mask=mask, prompt_len=len(prompt),
                             turn_lengths=lengths, step_rewards=step_rewards,
                             reward=float(sum(step_rewards))))
    return seqs


def gigpo_cases():
    seqs = gigpo_batch()
    mask = [m for s in seqs for m in s["mask"]]
    out = []
    for name, (est, sh) in GIGPO_CASES.items():
        row_adv = gigpo_row_advantages(est.get("gamma", 0.95), est.get("step_advantage_w", 1.0),
                                       est.get("mode", "mean_norm"), est.get("eps", 1e-6))
        tok, r = [], 0
        for s, turns in zip(seqs, [t for group in GIGPO_GROUPS for t in group]):
            adv = [0.0] * len(s["tokens"])
            at = s["prompt_len"]
            for k, (_, n_act, _) in enumerate(turns):
                if k > 0:
                    at += len(OBS_TOKENS[turns[k][0]])
                for t in range(at, at + n_act):
                    adv[t] = float(row_adv[r])
                at += n_act
                r += 1
            tok += adv
        adv = np.asarray(tok, dtype=np.float64)
        if sh.get("whiten_advantages", False):
            adv = whiten_tokens(adv, mask)
        if sh.get("advantage_clip") is not None:
            adv = np.clip(adv, -sh["advantage_clip"], sh["advantage_clip"])
        out.append(dict(name=name, estimator=est, shaping=sh,
                        advantages=[float(a) for a in adv * np.asarray(mask, float)]))
    return dict(sequences=seqs, group_sizes=[len(g) for g in GIGPO_GROUPS], cases=out)


def rust_array(name, values):
    body = ", ".join(repr(float(v)) for v in values)
    return f"#[rustfmt::skip]\nconst {name.upper()}: [f64; {len(values)}] = [{body}];"


def build():
    inp = make_inputs()
    data = dict(
        note="generated by `python scripts/reference_losses.py generate`; do not edit",
        inputs={k: (list(map(float, v)) if isinstance(v, np.ndarray) else v)
                for k, v in inp.items()},
        cases=cases(inp),
        shaping=shaping_cases(),
        running=running_cases(),
        gigpo=gigpo_cases(),
    )
    return data


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    if mode == "generate":
        data = build()
        with open(FIXTURE, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"wrote {FIXTURE} ({len(data['cases'])} cases)")
        print("// advantage references (paste into crates/rollflash-train/tests/it/advantage.rs)")
        for k, v in advantages().items():
            print(rust_array(k, v))
    elif mode == "check":
        with open(FIXTURE) as f:
            old = json.load(f)
        new = build()
        worst = 0.0
        for a, b in zip(old["cases"], new["cases"]):
            assert a["name"] == b["name"]
            worst = max(worst, abs(a["loss"] - b["loss"]),
                        max(abs(x - y) for x, y in zip(a["grad"], b["grad"])))
        for a, b in zip(old["shaping"]["cases"], new["shaping"]["cases"]):
            assert a["name"] == b["name"]
            worst = max(worst, max(abs(x - y) for x, y in zip(a["advantages"], b["advantages"])))
        for a, b in zip(old["running"], new["running"]):
            assert a["name"] == b["name"]
            for sa, sb in zip(a["steps"], b["steps"]):
                worst = max(worst, max(abs(x - y) for x, y in
                                       zip(sa["normalized"], sb["normalized"])),
                            abs(sa["mean"] - sb["mean"]), abs(sa["var"] - sb["var"]))
        for a, b in zip(old["gigpo"]["cases"], new["gigpo"]["cases"]):
            assert a["name"] == b["name"]
            worst = max(worst, max(abs(x - y) for x, y in zip(a["advantages"], b["advantages"])))
        print(f"{len(new['cases'])} cases, max abs difference to fixture {worst:.3g}")
        if worst > 1e-12:
            sys.exit(1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
