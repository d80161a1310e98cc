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

What it is not: fast, a serving engine, a bf16-faithful model, or a tokenizer. KDA uses the
plain recurrence of §3.6 (no chunking), MLA the non-absorbed form of §4.1 (no cache).

As a test (`--bindir BUILD`): writes tiny and tiny-48b checkpoints with k3pd-mkckpt into a temp
dir, runs `k3pd-generate --precision fp32 --all-logits --logits-out` on prompts of length
1, 5 and 70, teacher-forces the generated tokens through this model and checks the relative L2
error of every logits row (prefill rows and decode-step rows) against --tol. Exit 1 on any
disagreement.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

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
            codes[:, 0::2] = packed & 0x0F
            codes[:, 1::2] = packed >> 4
            s = np.exp2(scale.astype(np.float64) - 127.0)
            self._mx[name] = E2M1[codes] * np.repeat(s, 32, axis=1)[:, :codes.shape[1]]
        return self._mx[name]

    def linear(self, name):
        """Weight of an nn.Linear: bf16 `.weight`, or MXFP4 packed (routed experts)."""
        if self.has(name + ".weight"):
            return self[name + ".weight"]
        return self.mxfp4(name)


# ------------------------------------------------------------------------------------------
# Elementary ops (float64 everywhere)

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):  # torch F.softplus(beta=1, threshold=20), 48B §3.3
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def lin(x, w):  # y = W x for each row of x
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
        self.eps = c["rms_norm_eps"]
        la = c["linear_attn_config"]
        self.kda_layers = set(la["kda_layers"])          # 1-indexed (§1.3)
        self.kda_nh, self.kda_dk = la["num_heads"], la["head_dim"]
        self.conv_w = la["short_conv_kernel_size"]
        self.lower_bound = la.get("gate_lower_bound")    # K3 lower-bound gate; None -> softplus
        self.full_rank_gate = la.get("use_full_rank_gate", False)
        self.block = c.get("attn_res_block_size")        # None -> plain pre-norm residual (48B)
        if not c.get("mla_use_nope", False):
            raise ValueError("mla_use_nope=false: RoPE is not specified by the spec")
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
            return silu(gate) * up
        b, bl = self.c["activation_situ_beta"], self.c["activation_situ_linear_beta"]
        return (b * np.tanh(gate / b) * sigmoid(gate)) * (bl * np.tanh(up / bl))

    def mlp(self, x, p):
        return lin(self.act_mul(lin(x, self.ck.linear(p + "gate_proj")),
                                lin(x, self.ck.linear(p + "up_proj"))),
                   self.ck.linear(p + "down_proj"))

    # --- §2.2 depth mixer ----------------------------------------------------------------
    def mix(self, B, P, proj, norm):
        if not B:
            return P
        v = np.stack(B + [P])                            # [n, T, H]
        r = 1.0 / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-5)
        s = np.sum(v * r * (self.ck[norm + ".weight"] * self.ck[proj + ".weight"][0]), axis=-1)
        a = softmax(s, axis=0)                           # [n, T]
        return np.sum(a[..., None] * v, axis=0)

    # --- §3 KDA ---------------------------------------------------------------------------
    def kda(self, x, p, l):
        ck, NH, DK = self.ck, self.kda_nh, self.kda_dk
        T, W = x.shape[0], self.conv_w

        def conv(name, xin):  # §3.2 causal depthwise conv + SiLU; w[c][W-1] hits token t
            w = ck[p + name + ".weight"].reshape(xin.shape[1], W)
            xp = np.concatenate([np.zeros((W - 1, xin.shape[1])), xin])
            y = sum(w[:, j] * xp[j:j + T] for j in range(W))
            return silu(y)

        q = conv("q_conv1d", lin(x, ck[p + "q_proj.weight"])).reshape(T, NH, DK)
        k = conv("k_conv1d", lin(x, ck[p + "k_proj.weight"])).reshape(T, NH, DK)
        v = conv("v_conv1d", lin(x, ck[p + "v_proj.weight"])).reshape(T, NH, DK)
        g_raw = lin(lin(x, ck[p + "f_a_proj.weight"]), ck[p + "f_b_proj.weight"])
        b_raw = lin(x, ck[p + "b_proj.weight"])
        if self.full_rank_gate:
            z = lin(x, ck[p + "g_proj.weight"])
        else:  # 48B §3.1 low-rank output gate
            z = lin(lin(x, ck[p + "g_a_proj.weight"]), ck[p + "g_b_proj.weight"])
        # §3.3 L2 norm per head (eps inside sqrt of the SUM), then q * DK^-0.5
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6) * DK ** -0.5
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
        # §3.4 gate (per head A_log, first NH entries), 48B §3.3 softplus form
        A = ck[p + "A_log"].reshape(-1)[:NH][None, :, None]
        gi = (g_raw + ck[p + "dt_bias"]).reshape(T, NH, DK)
        if self.lower_bound is not None:
            g = self.lower_bound * sigmoid(np.exp(A) * gi)
        else:
            g = -np.exp(A) * softplus(gi)
        beta = sigmoid(b_raw)                            # §3.5, [T, NH]
        self._rec(f"L{l}.kda.q", q); self._rec(f"L{l}.kda.k", k); self._rec(f"L{l}.kda.v", v)
        self._rec(f"L{l}.kda.g", g); self._rec(f"L{l}.kda.beta", beta)
        # §3.6 recurrence, S[h][k][v]
        S = np.zeros((NH, DK, DK))
        o = np.empty((T, NH, DK))
        for t in range(T):
            S = S * np.exp(g[t])[:, :, None]
            u = v[t] - np.einsum("hkv,hk->hv", S, k[t])
            S = S + beta[t][:, None, None] * k[t][:, :, None] * u[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, q[t])
        self._rec(f"L{l}.kda.o", o)
        # §3.7 gated RMSNorm over each head, o_proj
        on = rmsnorm(o, ck[p + "o_norm.weight"], self.eps) * sigmoid(z.reshape(T, NH, DK))
        return lin(on.reshape(T, NH * DK), ck[p + "o_proj.weight"])

    # --- §4.1 MLA (non-absorbed), NoPE ----------------------------------------------------
    def mla(self, x, p, l):
        ck, c = self.ck, self.c
        T = x.shape[0]
        NHm, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                           c["qk_rope_head_dim"], c["v_head_dim"])
        cr = c["kv_lora_rank"]
        if c.get("q_lora_rank"):
            cq = rmsnorm(lin(x, ck[p + "q_a_proj.weight"]), ck[p + "q_a_layernorm.weight"], 1e-6)
            q = lin(cq, ck[p + "q_b_proj.weight"])
        else:  # 48B §4
            q = lin(x, ck[p + "q_proj.weight"])
        q = q.reshape(T, NHm, dn + dr)
        ckv = lin(x, ck[p + "kv_a_proj_with_mqa.weight"])
        cn = rmsnorm(ckv[:, :cr], ck[p + "kv_a_layernorm.weight"], 1e-6)
        krot = ckv[:, cr:]                               # shared by all heads, never rotated
        kv = lin(cn, ck[p + "kv_b_proj.weight"]).reshape(T, NHm, dn + dv)
        K = np.concatenate([kv[:, :, :dn], np.broadcast_to(krot[:, None, :], (T, NHm, dr))], -1)
        V = kv[:, :, dn:]
        sc = np.einsum("thd,shd->hts", q, K) * (dn + dr) ** -0.5
        sc = np.where(np.tril(np.ones((T, T), bool))[None], sc, -np.inf)
        o = np.einsum("hts,shd->thd", softmax(sc, -1), V).reshape(T, NHm * dv)
        self._rec(f"L{l}.mla.o", o)
        if c.get("mla_use_output_gate", False):
            o = o * sigmoid(lin(x, ck[p + "g_proj.weight"]))
        return lin(o, ck[p + "o_proj.weight"])

    # --- §5.3 router ----------------------------------------------------------------------
    def route(self, x, p):
        ck, c = self.ck, self.c
        s = sigmoid(lin(x, ck[p + "gate.weight"]))       # [T, E]
        sc = s + ck[p + "gate.e_score_correction_bias"]
        E, topk = s.shape[1], c["num_experts_per_token"]
        ng, tg = c.get("num_expert_group", 1) or 1, c.get("topk_group", 1) or 1
        if c.get("use_grouped_topk", False) and ng > 1:
            gs = np.sort(sc.reshape(-1, ng, E // ng), axis=-1)[..., -2:].sum(-1)  # [T, ng]
            keep = np.argsort(-gs, axis=-1, kind="stable")[:, :tg]
            mask = np.zeros((sc.shape[0], ng), bool)
            np.put_along_axis(mask, keep, True, axis=-1)
            sc = np.where(np.repeat(mask, E // ng, axis=1), sc, -np.inf)
        idx = np.argsort(-sc, axis=-1, kind="stable")[:, :topk]
        w = np.take_along_axis(s, idx, axis=-1)
        if c.get("moe_renormalize", True) and topk > 1:
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
                h = self.act_mul(ck.linear(ep + "w1") @ z[t], ck.linear(ep + "w3") @ z[t])
                comb[t] += we * (ck.linear(ep + "w2") @ h)
        if latent:
            if self.c.get("latent_moe_use_norm", False):
                comb = rmsnorm(comb, ck[p + "routed_expert_norm.weight"], self.eps)
            comb = lin(comb, ck[p + "routed_expert_up_proj.weight"])
        return comb + self.mlp(x, p + "shared_experts.")

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
                    B.append(P)
                a = mixer(rmsnorm(h, ck[p + "input_layernorm.weight"], self.eps), p + "self_attn.", l)
                P = a if start else P + a
                h2 = self.mix(B, P, p + "mlp_res_proj", p + "mlp_res_norm")
            else:  # 48B §2 plain pre-norm residual
                P = P + mixer(rmsnorm(P, ck[p + "input_layernorm.weight"], self.eps), p + "self_attn.", l)
                h2 = P
            xn = rmsnorm(h2, ck[p + "post_attention_layernorm.weight"], self.eps)
            f = self.mlp(xn, p + "mlp.") if l < dense else self.moe(xn, p + "block_sparse_moe.", l)
            P = P + f
            self._rec(f"L{l}.out", P)
        if self.block:
            P = self.mix(B, P, "model.output_attn_res_proj", "model.output_attn_res_norm")
        h = rmsnorm(P, ck["model.norm.weight"], self.eps)
        return lin(h, ck["lm_head.weight"])


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


def run_c(bindir, model, ids, new_tokens, workdir):
    out = os.path.join(workdir, "logits.bin")
    cmd = [os.path.join(bindir, "tools/generate/k3pd-generate"), "--model", model,
           "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new_tokens),
           "--precision", "fp32", "--ignore-eos", "--all-logits", "--logits-out", out]
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


def check_case(bindir, model, ids, new_tokens, tol, workdir):
    """Returns the per-row relative L2 errors; rows = prompt positions, then decode steps."""
    lc, gen = run_c(bindir, model, ids, new_tokens, workdir)
    # The generated list may or may not repeat the prompt: take the new tokens at the end.
    new = gen[-new_tokens:] if len(gen) >= new_tokens else gen
    full = list(ids) + new
    ref = Model(Ckpt(model)).forward(full[:lc.shape[0]])
    if lc.shape != ref.shape:
        raise RuntimeError(f"logits rows {lc.shape} vs reference {ref.shape}")
    err = np.linalg.norm(lc - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return err


def mkckpt(bindir, preset, seed, out):
    cmd = [os.path.join(bindir, "tools/mkckpt/k3pd-mkckpt"), "--preset", preset, "--out", out,
           "--seed", str(seed)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bindir", help="build dir with k3pd-mkckpt and k3pd-generate (test mode)")
    ap.add_argument("--model", help="checkpoint dir: print logits of --ids (no comparison)")
    ap.add_argument("--ids", default="1,2,3", help="prompt ids for --model")
    ap.add_argument("--presets", default="tiny,tiny-48b")
    ap.add_argument("--seeds", default="1,7")
    ap.add_argument("--lengths", default="1,5,70")
    ap.add_argument("--new-tokens", type=int, default=4, help="generated tokens (decode rows)")
    ap.add_argument("--tol", type=float, default=1e-3, help="max relative L2 error per row")
    a = ap.parse_args()
    if a.model:
        ids = [int(t) for t in a.ids.split(",")]
        lg = Model(Ckpt(a.model)).forward(ids)
        for t, row in enumerate(lg):
            print(f"pos {t}: argmax {int(np.argmax(row))} norm {np.linalg.norm(row):.6f}")
        return 0
    if not a.bindir:
        ap.error("give --bindir (test mode) or --model")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="k3pd_pyref_") as tmp:
        for preset in a.presets.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                ck = os.path.join(tmp, f"{preset}_{seed}")
                mkckpt(a.bindir, preset, seed, ck)
                for n in (int(s) for s in a.lengths.split(",")):
                    ids = [(37 * i + 11 * seed + 1) % 4000 + 1 for i in range(n)]
                    t0 = time.time()
                    err = check_case(a.bindir, ck, ids, a.new_tokens, a.tol, tmp)
                    pre, dec = err[:n], err[n:]
                    ok = bool(np.all(err < a.tol))
                    bad += not ok
                    print(f"{'ok ' if ok else 'BAD'} {preset:8s} seed {seed} T={n:3d}: prefill rows "
                          f"max {pre.max():.2e} mean {pre.mean():.2e}; decode rows max "
                          f"{dec.max() if dec.size else 0:.2e} ({time.time() - t0:.1f} s)")
                    if not ok:
                        worst = np.argsort(-err)[:5]
                        print("    worst rows (row: err): " +
                              ", ".join(f"{int(r)}: {err[r]:.2e}" for r in worst))
    print(f"{'FAIL' if bad else 'PASS'}: {bad} case(s) above tol {a.tol:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
