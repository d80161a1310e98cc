#!/usr/bin/env python3
"""Independent float64 numpy reference of the Kimi-K3 / Kimi-Linear-48B text model.

What it is: the model math of /work/shared/spec/k3-model.md (§1-§8) and its 48B delta
(kimi-linear-48b.md), written from the spec text ONLY (not from kernels/ or the synthetic
checkpoint writer), so that a misreading of the spec in the C reference (kernels/cpu +
kernels/runner) shows up as a disagreement. It reads a checkpoint directory (config.json +
*.safetensors, parsed here with struct/json) and computes the logits of every position of one
prompt in one causal pass. Every value is float64; weights are read exactly (bf16 = upper 16
bits of an fp32, MXFP4 dequantised per §6) and there are no bf16 rounding points, so it is the
counterpart of the runner's `--precision fp32` mode.

What it is not: fast, a serving engine, a bit-exact bf16 model (--emulate-bf16 is a
diagnostic), or a tokenizer. KDA uses the plain recurrence of §3.6 (no chunking), MLA the
non-absorbed form of §4.1 (no cache) and NoPE: both specs say no rotary is applied anywhere
(K3 §4, 48B §4), so a config with mla_use_nope=false is refused rather than guessed.

As a test (`--bindir BUILD`): writes tiny and tiny-48b checkpoints (seeds 1 and 7) with
k3pd-mkckpt into a temp dir, runs `k3pd-generate --precision fp32 --all-logits --logits-out`
on prompts of length 1, 5 and 70 (+3 decode steps), teacher-forces the generated tokens
through this model and checks the relative L2 error of every logits row against --tol (1e-3;
measured <= 6e-6). Variants: an eps-probe copy of each checkpoint (inputs of every eps-bearing
norm scaled near the eps) and a K3 grouped-router config. With --mutants, each of MUTANTS (a
plausible misreading of the spec) must also be caught by at least one checkpoint, which shows
the comparison can see that kind of error. Exit 1 on any disagreement or uncaught mutant.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    sys.exit("ref_k3.py: numpy missing (apt-get install python3-numpy)")

# Deliberate misreadings of the spec ("mutants"), switched on by --mutants: each one must make
# the comparison with the C reference fail, which shows the check can see that kind of error.
# Those the synthetic checkpoints cannot see are reported as blind spots. Empty in normal runs.
MUT = set()
MUTANTS = {
    "nibble_hi_first": "§6: element 2j in the HIGH nibble",
    "e8m0_bias_126": "§6: scale 2^(e-126)",
    "alog_per_channel": "§3.4: A_log read per channel instead of per head",
    "conv_taps_reversed": "§3.2: w[c][0] multiplies the current token",
    "kda_qk_rmsnorm": "§3.3: q/k RMS-normalised (mean) instead of L2 (sum)",
    "kda_no_q_scale": "§3.3: q not multiplied by DK^-0.5",
    "kda_gate_swapped": "§3.4 / 48B §3.3: the other gate form",
    "kda_decay_value_axis": "§3.6: decay applied along the value axis of S",
    "kda_output_before_update": "§3.6: o_t from S before the delta update",
    "kda_onorm_silu": "§3.7: output gate silu(z) instead of sigmoid(z)",
    "mla_eps_1e5": "§4.1: q_a/kv_a layernorm eps 1e-5 instead of 1e-6",
    "kda_l2_eps_1e5": "§3.3: q/k L2 norm eps 1e-5 instead of 1e-6",
    "onorm_eps_1e6": "§3.7: KDA o_norm eps 1e-6 instead of 1e-5",
    "norm_eps_1e6": "§8: rms_norm_eps norms with eps 1e-6 instead of 1e-5",
    "mix_eps_1e6": "§2.2: depth-mixer norm eps 1e-6 instead of 1e-5",
    "mla_scale_nope_only": "§4.1: softmax scale qk_nope^-0.5 instead of (nope+rope)^-0.5",
    "mla_krot_zero": "§4.1: k_rot/q_rot dims dropped",
    "mla_no_output_gate": "§4.1: no sigmoid output gate",
    "router_biased_weights": "§5.3: expert weights from the bias-corrected scores",
    "router_no_renorm": "§5.3: no renormalisation",
    "router_no_groups": "§5.3: group-limited step skipped with num_expert_group > 1",
    "router_group_max": "§5.3: group score = max instead of the sum of the top-2",
    "router_scale_shared_too": "48B §5.3: routed_scaling_factor applied to the shared expert too",
    "situ_docstring": "§12.2: gate*sigmoid(beta*gate) * up",
    "latent_no_norm": "§5.4: no routed_expert_norm",
    "res_snapshot_mixed": "§2.3: snapshot the mixed h instead of P_in",
    "res_no_reset": "§2.3: P not reset at a block boundary",
    "res_norm_then_mix": "§2.4: final norm before the final depth mix",
}

# ------------------------------------------------------------------------------------------
# Checkpoint reading (safetensors: u64 LE header length, JSON header, raw little-endian data)

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def read_safetensors(path, out):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = blob[base + a:base + b]
        dt, shape = meta["dtype"], meta["shape"]
        if dt == "BF16":
            u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            arr = u.view(np.float32).astype(np.float64)
        elif dt == "F32":
            arr = np.frombuffer(raw, "<f4").astype(np.float64)
        elif dt == "U8":
            arr = np.frombuffer(raw, np.uint8).copy()
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {dt} not expected by the spec")
        if name in out:
            raise ValueError(f"{path}: tensor {name} appears twice")
        out[name] = arr.reshape(shape)


class Ckpt:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            top = json.load(f)
        # K3: nested text_config and a "language_model." prefix; 48B: flat, no prefix (48B §0).
        self.cfg = top.get("text_config", top)
        self.t = {}
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
        if not files:
            raise ValueError(f"{d}: no *.safetensors")
        for fn in files:
            read_safetensors(os.path.join(d, fn), self.t)
        self.prefix = "language_model." if "text_config" in top else ""
        self._mx = {}

    def has(self, name):
        return self.prefix + name in self.t

    def __getitem__(self, name):
        key = self.prefix + name
        if key not in self.t:
            raise KeyError(f"tensor {key} missing from the checkpoint")
        return self.t[key]

    def mxfp4(self, name):
        """§6: W[n][k] = E2M1(code) * 2^(scale[n][k/32] - 127); low nibble = even k."""
        if name not in self._mx:
            packed, scale = self[name + ".weight_packed"], self[name + ".weight_scale"]
            codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
            lo, hi = packed & 0x0F, packed >> 4
            if "nibble_hi_first" in MUT:
                lo, hi = hi, lo
            codes[:, 0::2], codes[:, 1::2] = lo, hi
            s = np.exp2(scale.astype(np.float64) - (126.0 if "e8m0_bias_126" in MUT else 127.0))
            self._mx[name] = E2M1[codes] * np.repeat(s, 32, axis=1)[:, :codes.shape[1]]
        return self._mx[name]

    def linear(self, name):
        """Weight of an nn.Linear: bf16 `.weight`, or MXFP4 packed (routed experts)."""
        if self.has(name + ".weight"):
            return self[name + ".weight"]
        return self.mxfp4(name)


def eps_probe_copy(src, dst):
    """Copy of checkpoint `src` in which some inputs of eps-carrying norms are scaled by exact
    powers of two so their mean square is near the eps: with the synthetic N(0, 0.02^2) weights
    every eps of the spec is invisible at 1e-3, here a wrong eps is not. Scaling bf16/fp32 by
    2^-n is exact (no subnormals at these sizes). Rules: (name suffix, KDA layers only, rows, n)."""
    import shutil
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        top = json.load(f)
    cfg = top.get("text_config", top)
    kda = {l - 1 for l in cfg["linear_attn_config"]["kda_layers"]}
    cr = cfg["kv_lora_rank"]
    rules = [("self_attn.q_a_proj.weight", False, None, 6),           # §4.1 q_a_layernorm eps
             ("self_attn.kv_a_proj_with_mqa.weight", False, cr, 6),   # §4.1 kv_a_layernorm eps
             ("self_attn.q_proj.weight", True, None, 6),              # §3.3 L2 eps
             ("self_attn.k_proj.weight", True, None, 6),
             ("self_attn.v_proj.weight", True, None, 8),              # §3.7 o_norm eps
             ("model.embed_tokens.weight", False, None, 6)]           # §2.2 / §8 norm eps
    for fn in sorted(x for x in os.listdir(dst) if x.endswith(".safetensors")):
        path = os.path.join(dst, fn)
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        mm = np.memmap(path, np.uint8, "r+")
        for name, meta in header.items():
            for suffix, kda_only, rows, n in rules:
                if not name.endswith(suffix):
                    continue
                if kda_only and int(name.split("layers.")[1].split(".")[0]) not in kda:
                    continue
                a, b = meta["data_offsets"]
                raw = mm[8 + hlen + a:8 + hlen + b]
                if meta["dtype"] == "BF16":
                    u = raw.view("<u2").reshape(meta["shape"])
                    f32 = (u.astype(np.uint32) << 16).view(np.float32) * np.float32(2.0 ** -n)
                    scaled = (f32.view(np.uint32) >> 16).astype(np.uint16)
                    u[:rows] = scaled[:rows]
                else:
                    raise ValueError(f"eps probe: {name} is {meta['dtype']}, expected BF16")
        mm.flush()
        del mm


# ------------------------------------------------------------------------------------------
# Elementary ops (float64 everywhere)

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):  # torch F.softplus(beta=1, threshold=20), 48B §3.3
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


# --emulate-bf16 (diagnostic only): round to bf16 (RNE) at the "stored bf16" points of §8, to
# tell the C runner's bf16 mode's deviation from float64 apart from a bf16-mode bug. Off in the
# test, where the model is exact float64.
BF16 = False


def bf(x):
    if not BF16:
        return x
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


def rmsnorm(x, w, eps):  # §8: w * bf16(x * rstd), stored bf16
    return bf(bf(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w)


def lin(x, w):  # y = W x for each row of x; a GEMM output is stored bf16 (§8)
    return bf(x @ w.T)


def lin32(x, w):  # fp32 islands: router logits, b_raw, lm_head logits
    return x @ w.T


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


# ------------------------------------------------------------------------------------------
# The model

class Model:
    def __init__(self, ck):
        self.ck, c = ck, ck.cfg
        self.c = c
        self.H = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.eps = 1e-6 if "norm_eps_1e6" in MUT else c["rms_norm_eps"]
        self.onorm_eps = 1e-6 if "onorm_eps_1e6" in MUT else c["rms_norm_eps"]
        la = c["linear_attn_config"]
        self.kda_layers = set(la["kda_layers"])          # 1-indexed (§1.3)
        self.kda_nh, self.kda_dk = la["num_heads"], la["head_dim"]
        self.conv_w = la["short_conv_kernel_size"]
        self.lower_bound = la.get("gate_lower_bound")    # K3 lower-bound gate; None -> softplus
        self.full_rank_gate = la.get("use_full_rank_gate", False)
        self.block = c.get("attn_res_block_size")        # None -> plain pre-norm residual (48B)
        if not c.get("mla_use_nope", False):
            raise ValueError("mla_use_nope=false: RoPE is not specified by the spec")
        if c.get("moe_layer_freq", 1) != 1:
            raise ValueError("moe_layer_freq != 1 is not specified by the spec")
        self.act = c["hidden_act"]
        if self.act not in ("situ", "silu"):
            raise ValueError(f"hidden_act {self.act!r} not in the spec")
        self.trace = None  # optional dict: name -> intermediate values (debugging / bisection)

    def _rec(self, name, v):
        if self.trace is not None:
            self.trace[name] = v.copy()

    # --- §5.1 / 48B §5.1 gated activation ----------------------------------------------
    def act_mul(self, gate, up):
        if self.act == "silu":
            return bf(silu(gate) * up)
        b, bl = self.c["activation_situ_beta"], self.c["activation_situ_linear_beta"]
        if "situ_docstring" in MUT:
            return gate * sigmoid(b * gate) * up
        return bf((b * np.tanh(gate / b) * sigmoid(gate)) * (bl * np.tanh(up / bl)))

    def mlp(self, x, p):
        return lin(self.act_mul(lin(x, self.ck.linear(p + "gate_proj")),
                                lin(x, self.ck.linear(p + "up_proj"))),
                   self.ck.linear(p + "down_proj"))

    # --- §2.2 depth mixer ----------------------------------------------------------------
    def mix(self, B, P, proj, norm):
        if not B:
            return P
        v = np.stack(B + [P])                            # [n, T, H]
        eps = 1e-6 if "mix_eps_1e6" in MUT else 1e-5
        r = 1.0 / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
        s = np.sum(v * r * (self.ck[norm + ".weight"] * self.ck[proj + ".weight"][0]), axis=-1)
        a = softmax(s, axis=0)                           # [n, T]
        return bf(np.sum(a[..., None] * v, axis=0))

    # --- §3 KDA ---------------------------------------------------------------------------
    def kda(self, x, p, l):
        ck, NH, DK = self.ck, self.kda_nh, self.kda_dk
        T, W = x.shape[0], self.conv_w

        def conv(name, xin):  # §3.2 causal depthwise conv + SiLU; w[c][W-1] hits token t
            w = ck[p + name + ".weight"].reshape(xin.shape[1], W)
            xp = np.concatenate([np.zeros((W - 1, xin.shape[1])), xin])
            if "conv_taps_reversed" in MUT:
                w = w[:, ::-1]
            y = sum(w[:, j] * xp[j:j + T] for j in range(W))
            return bf(silu(y))

        q = conv("q_conv1d", lin(x, ck[p + "q_proj.weight"])).reshape(T, NH, DK)
        k = conv("k_conv1d", lin(x, ck[p + "k_proj.weight"])).reshape(T, NH, DK)
        v = conv("v_conv1d", lin(x, ck[p + "v_proj.weight"])).reshape(T, NH, DK)
        g_raw = lin(lin(x, ck[p + "f_a_proj.weight"]), ck[p + "f_b_proj.weight"])
        b_raw = lin32(x, ck[p + "b_proj.weight"])
        if self.full_rank_gate:
            z = lin(x, ck[p + "g_proj.weight"])
        else:  # 48B §3.1 low-rank output gate
            z = lin(lin(x, ck[p + "g_a_proj.weight"]), ck[p + "g_b_proj.weight"])
        # §3.3 L2 norm per head (eps inside sqrt of the SUM), then q * DK^-0.5
        red = np.mean if "kda_qk_rmsnorm" in MUT else np.sum
        l2eps = 1e-5 if "kda_l2_eps_1e5" in MUT else 1e-6
        q = q / np.sqrt(red(q * q, axis=-1, keepdims=True) + l2eps)
        q = q if "kda_no_q_scale" in MUT else q * DK ** -0.5
        k = k / np.sqrt(red(k * k, axis=-1, keepdims=True) + l2eps)
        # §3.4 gate (per head A_log, first NH entries), 48B §3.3 softplus form
        A = ck[p + "A_log"].reshape(-1)[:NH][None, :, None]
        if "alog_per_channel" in MUT:
            A = ck[p + "A_log"].reshape(-1)[:NH * DK].reshape(1, NH, DK)
        gi = (g_raw + ck[p + "dt_bias"]).reshape(T, NH, DK)
        if (self.lower_bound is not None) != ("kda_gate_swapped" in MUT):
            lb = self.lower_bound if self.lower_bound is not None else -5.0
            g = lb * sigmoid(np.exp(A) * gi)
        else:
            g = -np.exp(A) * softplus(gi)
        beta = sigmoid(b_raw)                            # §3.5, [T, NH]
        self._rec(f"L{l}.kda.q", q); self._rec(f"L{l}.kda.k", k); self._rec(f"L{l}.kda.v", v)
        self._rec(f"L{l}.kda.g", g); self._rec(f"L{l}.kda.beta", beta)
        # §3.6 recurrence, S[h][k][v]
        S = np.zeros((NH, DK, DK))
        o = np.empty((T, NH, DK))
        for t in range(T):
            S = S * (np.exp(g[t])[:, None, :] if "kda_decay_value_axis" in MUT
                     else np.exp(g[t])[:, :, None])
            u = v[t] - np.einsum("hkv,hk->hv", S, k[t])
            if "kda_output_before_update" in MUT:
                o[t] = np.einsum("hkv,hk->hv", S, q[t])
            S = S + beta[t][:, None, None] * k[t][:, :, None] * u[:, None, :]
            if "kda_output_before_update" not in MUT:
                o[t] = np.einsum("hkv,hk->hv", S, q[t])
        self._rec(f"L{l}.kda.o", o)
        # §3.7 gated RMSNorm over each head, o_proj
        zz = z.reshape(T, NH, DK)
        o = bf(o)
        on = (o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + self.onorm_eps)
              * ck[p + "o_norm.weight"]) * (
            silu(zz) if "kda_onorm_silu" in MUT else sigmoid(zz))
        return lin(bf(on).reshape(T, NH * DK), ck[p + "o_proj.weight"])

    # --- §4.1 MLA (non-absorbed), NoPE ----------------------------------------------------
    def mla(self, x, p, l):
        ck, c = self.ck, self.c
        T = x.shape[0]
        NHm, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                           c["qk_rope_head_dim"], c["v_head_dim"])
        cr = c["kv_lora_rank"]
        leps = 1e-5 if "mla_eps_1e5" in MUT else 1e-6
        if c.get("q_lora_rank"):
            cq = rmsnorm(lin(x, ck[p + "q_a_proj.weight"]), ck[p + "q_a_layernorm.weight"], leps)
            q = lin(cq, ck[p + "q_b_proj.weight"])
        else:  # 48B §4
            q = lin(x, ck[p + "q_proj.weight"])
        q = q.reshape(T, NHm, dn + dr)
        ckv = lin(x, ck[p + "kv_a_proj_with_mqa.weight"])
        cn = rmsnorm(ckv[:, :cr], ck[p + "kv_a_layernorm.weight"], leps)
        krot = ckv[:, cr:]                               # shared by all heads, never rotated
        if "mla_krot_zero" in MUT:
            krot = krot * 0.0
        kv = lin(cn, ck[p + "kv_b_proj.weight"]).reshape(T, NHm, dn + dv)
        K = np.concatenate([kv[:, :, :dn], np.broadcast_to(krot[:, None, :], (T, NHm, dr))], -1)
        V = kv[:, :, dn:]
        dqk = dn if "mla_scale_nope_only" in MUT else dn + dr
        sc = np.einsum("thd,shd->hts", q, K) * dqk ** -0.5
        sc = np.where(np.tril(np.ones((T, T), bool))[None], sc, -np.inf)
        o = np.einsum("hts,shd->thd", softmax(sc, -1), V).reshape(T, NHm * dv)
        self._rec(f"L{l}.mla.o", o)
        if c.get("mla_use_output_gate", False) and "mla_no_output_gate" not in MUT:
            o = bf(bf(o) * bf(sigmoid(lin(x, ck[p + "g_proj.weight"]))))
        return lin(bf(o), ck[p + "o_proj.weight"])

    # --- §5.3 router ----------------------------------------------------------------------
    def route(self, x, p):
        ck, c = self.ck, self.c
        s = sigmoid(lin32(x, ck[p + "gate.weight"]))     # [T, E]
        sc = s + ck[p + "gate.e_score_correction_bias"]
        E, topk = s.shape[1], c["num_experts_per_token"]
        ng, tg = c.get("num_expert_group", 1) or 1, c.get("topk_group", 1) or 1
        if c.get("use_grouped_topk", False) and ng > 1 and "router_no_groups" not in MUT:
            gs = np.sort(sc.reshape(-1, ng, E // ng), axis=-1)[..., -2:].sum(-1)  # [T, ng]
            if "router_group_max" in MUT:
                gs = np.max(sc.reshape(-1, ng, E // ng), axis=-1)
            keep = np.argsort(-gs, axis=-1, kind="stable")[:, :tg]
            mask = np.zeros((sc.shape[0], ng), bool)
            np.put_along_axis(mask, keep, True, axis=-1)
            sc = np.where(np.repeat(mask, E // ng, axis=1), sc, -np.inf)
        idx = np.argsort(-sc, axis=-1, kind="stable")[:, :topk]
        w = np.take_along_axis(sc if "router_biased_weights" in MUT else s, idx, axis=-1)
        if c.get("moe_renormalize", True) and topk > 1 and "router_no_renorm" not in MUT:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
        return idx, w * c.get("routed_scaling_factor", 1.0)

    # --- §5.4 LatentMoE / 48B §5.4 plain MoE ----------------------------------------------
    def moe(self, x, p, l):
        ck = self.ck
        idx, w = self.route(x, p)
        self._rec(f"L{l}.moe.idx", idx); self._rec(f"L{l}.moe.w", w)
        latent = ck.has(p + "routed_expert_down_proj.weight")
        z = lin(x, ck[p + "routed_expert_down_proj.weight"]) if latent else x
        comb = np.zeros_like(z)
        for t in range(x.shape[0]):
            for e, we in zip(idx[t], w[t]):
                ep = p + f"experts.{e}."
                h = self.act_mul(bf(ck.linear(ep + "w1") @ z[t]), bf(ck.linear(ep + "w3") @ z[t]))
                comb[t] += we * bf(ck.linear(ep + "w2") @ h)
        comb = bf(comb)
        if latent:
            if self.c.get("latent_moe_use_norm", False) and "latent_no_norm" not in MUT:
                comb = rmsnorm(comb, ck[p + "routed_expert_norm.weight"], self.eps)
            comb = lin(comb, ck[p + "routed_expert_up_proj.weight"])
        shared = self.mlp(x, p + "shared_experts.")
        if "router_scale_shared_too" in MUT:
            shared = shared * self.c.get("routed_scaling_factor", 1.0)
        return bf(comb + shared)

    # --- §2.3 / §2.4 whole model -----------------------------------------------------------
    def forward(self, ids):
        ck, c = self.ck, self.c
        x = ck["model.embed_tokens.weight"][np.asarray(ids)]
        P, B = x, []
        dense = c.get("first_k_dense_replace", 0)
        for l in range(self.L):
            p = f"model.layers.{l}."
            mixer = self.kda if (l + 1) in self.kda_layers else self.mla
            if self.block:  # §2.3 Block Attention Residuals
                h = self.mix(B, P, p + "self_attention_res_proj", p + "self_attention_res_norm")
                start = l % self.block == 0
                if start:
                    B.append(h if "res_snapshot_mixed" in MUT else P)
                a = mixer(rmsnorm(h, ck[p + "input_layernorm.weight"], self.eps),
                          p + "self_attn.", l)
                P = a if start and "res_no_reset" not in MUT else bf(P + a)
                h2 = self.mix(B, P, p + "mlp_res_proj", p + "mlp_res_norm")
            else:  # 48B §2 plain pre-norm residual
                P = bf(P + mixer(rmsnorm(P, ck[p + "input_layernorm.weight"], self.eps),
                                 p + "self_attn.", l))
                h2 = P
            xn = rmsnorm(h2, ck[p + "post_attention_layernorm.weight"], self.eps)
            f = self.mlp(xn, p + "mlp.") if l < dense else self.moe(xn, p + "block_sparse_moe.", l)
            P = bf(P + f)
            self._rec(f"L{l}.out", P)
        if "res_norm_then_mix" in MUT and self.block:
            P = rmsnorm(P, ck["model.norm.weight"], self.eps)
            return lin32(self.mix(B, P, "model.output_attn_res_proj",
                                  "model.output_attn_res_norm"), ck["lm_head.weight"])
        if self.block:
            P = self.mix(B, P, "model.output_attn_res_proj", "model.output_attn_res_norm")
        h = rmsnorm(P, ck["model.norm.weight"], self.eps)
        return lin32(h, ck["lm_head.weight"])


# ------------------------------------------------------------------------------------------
# Comparison with the C reference (k3pd-generate)

def read_logits(path):
    with open(path, "rb") as f:
        hdr = f.read(32)
        if hdr[:8] != b"K3LOGITS":
            raise ValueError(f"{path}: not a K3LOGITS file")
        ver, hbytes, vocab, rows = struct.unpack_from("<IIQQ", hdr, 8)
    if ver != 1 or hbytes != 32:
        raise ValueError(f"{path}: version {ver} / header {hbytes} not supported")
    return np.fromfile(path, "<f4", offset=32).astype(np.float64).reshape(rows, vocab)


C_PRECISION = "fp32"  # --precision of k3pd-generate (bf16: rounding points of §8, looser tol)


def run_c(bindir, model, ids, new_tokens, workdir):
    out = os.path.join(workdir, "logits.bin")
    cmd = [os.path.join(bindir, "tools/generate/k3pd-generate"), "--model", model,
           "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new_tokens),
           "--precision", C_PRECISION, "--ignore-eos", "--all-logits", "--logits-out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    gen = None
    for line in r.stdout.splitlines():
        if line.startswith("ids:"):
            gen = [int(t) for t in line[4:].replace(",", " ").split()]
    if gen is None:
        raise RuntimeError(f"no 'ids:' line in k3pd-generate output:\n{r.stdout}")
    return read_logits(out), gen


def rel_err(lc, ref):
    if lc.shape != ref.shape:
        raise RuntimeError(f"logits rows {lc.shape} vs reference {ref.shape}")
    return np.linalg.norm(lc - ref, axis=1) / np.linalg.norm(ref, axis=1)


def check_case(bindir, model, ids, new_tokens, workdir):
    """C logits and the teacher-forced ids of their rows (prompt positions, then decode steps:
    the row of step i is computed on the prompt + the first i generated tokens)."""
    lc, gen = run_c(bindir, model, ids, new_tokens, workdir)
    # Take the new tokens from the end of the ids line (whether or not it repeats the prompt).
    full = list(ids) + gen[len(gen) - new_tokens:]
    return lc, full[:lc.shape[0]]


def mutant_check(lc, full, ck, base, tol, caught):
    """Each mutant vs the C logits lc: caught (>= tol), n/a (identical to the faithful model's
    logits `base`: the checkpoint lacks that feature) or blind (differs, but below tol). Adds
    the caught ones to the set `caught`."""
    for name, what in MUTANTS.items():
        MUT.clear(); MUT.add(name)
        if name in ("nibble_hi_first", "e8m0_bias_126"):
            ck._mx.clear()  # the dequantisation cache holds the faithful experts
        try:
            mref = Model(ck).forward(full)
            err = rel_err(lc, mref).max()
            na = np.array_equal(mref, base)
        except (ValueError, IndexError):  # the shapes do not allow this misreading
            err, na = 0.0, True
        finally:
            if name in ("nibble_hi_first", "e8m0_bias_126"):
                ck._mx.clear()
            MUT.clear()
        verdict = "n/a" if na else ("caught" if err >= tol else "BLIND")
        if verdict == "caught":
            caught.add(name)
        if verdict != "n/a":
            print(f"      mutant {name:26s} {verdict:6s} max err {err:.2e}  ({what})")


def mkckpt(bindir, source, seed, out):
    cmd = [os.path.join(bindir, "tools/mkckpt/k3pd-mkckpt"), *source, "--out", out,
           "--seed", str(seed)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")


def make_cases(a, tmp):
    """(label, checkpoint dir, lengths, run the mutants?) for every preset and seed, plus per
    preset an eps-probe copy (see eps_probe_copy) and, for K3, a grouped-router variant
    (num_expert_group 4, topk_group 2, routed_scaling_factor 2.5) written from a config.
    The mutants run on these variants only (between them they cover every mutant), at
    --mutant-length tokens (the cost is one Python forward per mutant)."""
    short = [a.mutant_length]
    for preset in a.presets:
        for i, seed in enumerate(a.seeds):
            d = os.path.join(tmp, f"{preset}_{seed}")
            mkckpt(a.bindir, ["--preset", preset], seed, d)
            yield f"{preset} seed {seed}", d, a.lengths, False
            if i == 0 and a.variants:
                eps_probe_copy(d, d + "_probe")
                yield f"{preset} seed {seed} eps-probe", d + "_probe", short, a.mutants
                if preset == "tiny":
                    with open(os.path.join(d, "config.json")) as f:
                        top = json.load(f)
                    top["text_config"].update(num_expert_group=4, topk_group=2,
                                              routed_scaling_factor=2.5)
                    cfgp = os.path.join(tmp, "grouped.json")
                    with open(cfgp, "w") as f:
                        json.dump(top, f)
                    g = os.path.join(tmp, f"grouped_{seed}")
                    mkckpt(a.bindir, ["--config", cfgp], seed, g)
                    yield f"{preset} seed {seed} grouped-router", g, short, a.mutants


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bindir", help="build dir with k3pd-mkckpt and k3pd-generate (test mode)")
    ap.add_argument("--model", help="checkpoint dir: print logits of --ids (no comparison)")
    ap.add_argument("--ids", default="1,2,3", help="prompt ids for --model")
    ap.add_argument("--presets", default="tiny,tiny-48b")
    ap.add_argument("--seeds", default="1,7")
    ap.add_argument("--lengths", default="1,5,70")
    ap.add_argument("--new-tokens", type=int, default=4, help="generated tokens (decode rows)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="k3pd-generate precision (bf16 needs a looser --tol; figures only)")
    ap.add_argument("--emulate-bf16", action="store_true",
                    help="round at the §8 bf16 points (diagnostic, with --precision bf16)")
    ap.add_argument("--tol", type=float, default=1e-3, help="max relative L2 error per row")
    ap.add_argument("--no-variants", dest="variants", action="store_false",
                    help="skip the eps-probe and grouped-router checkpoints")
    ap.add_argument("--mutants", action="store_true",
                    help="also require that every deliberate misreading (MUTANTS) is caught")
    ap.add_argument("--mutant-length", type=int, default=24, help="prompt length of the variants")
    a = ap.parse_args()
    if a.model:
        ids = [int(t) for t in a.ids.split(",")]
        lg = Model(Ckpt(a.model)).forward(ids)
        for t, row in enumerate(lg):
            print(f"pos {t}: argmax {int(np.argmax(row))} norm {np.linalg.norm(row):.6f}")
        return 0
    if not a.bindir:
        ap.error("give --bindir (test mode) or --model")
    for tool in ("tools/mkckpt/k3pd-mkckpt", "tools/generate/k3pd-generate"):
        if not os.access(os.path.join(a.bindir, tool), os.X_OK):
            sys.exit(f"ref_k3.py: --bindir {a.bindir}: no executable {tool} (build it first)")
    global C_PRECISION, BF16
    C_PRECISION, BF16 = a.precision, a.emulate_bf16
    a.presets = a.presets.split(",")
    a.seeds = [int(x) for x in a.seeds.split(",")]
    a.lengths = [int(x) for x in a.lengths.split(",")]
    bad, caught, t_start = 0, set(), time.time()
    with tempfile.TemporaryDirectory(prefix="k3pd_pyref_") as tmp:
        for label, d, lengths, mutants in make_cases(a, tmp):
            ck = Ckpt(d)
            for n in lengths:
                ids = [(37 * i + 11 * len(label) + 1) % 4000 + 1 for i in range(n)]
                t0 = time.time()
                lc, full = check_case(a.bindir, d, ids, a.new_tokens, tmp)
                ref = Model(ck).forward(full)
                err = rel_err(lc, ref)
                pre, dec = err[:n], err[n:]
                ok = bool(np.all(err < a.tol))
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} {label:32s} T={n:3d}: prefill rows max "
                      f"{pre.max():.2e} mean {pre.mean():.2e}; decode rows max "
                      f"{dec.max() if dec.size else 0:.2e} ({time.time() - t0:.1f} s)")
                if not ok:
                    print("    worst rows (row: err): " + ", ".join(
                        f"{int(r)}: {err[r]:.2e}" for r in np.argsort(-err)[:5]))
                if mutants and n == max(lengths):
                    mutant_check(lc, full, ck, ref, a.tol, caught)
    missed = sorted(set(MUTANTS) - caught) if a.mutants else []
    if missed:
        bad += 1
        print("FAIL: mutants no checkpoint catches (the check is blind to them): " +
              ", ".join(missed))
    elif a.mutants:
        print(f"all {len(MUTANTS)} mutants caught by at least one checkpoint")
    print(f"{'FAIL' if bad else 'PASS'}: {bad} failure(s), tol {a.tol:g}, "
          f"{time.time() - t_start:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
