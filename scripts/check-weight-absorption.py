#!/usr/bin/env python3
"""Checks kernels/NOTES.md's weight-absorption design for the shared-image decoder on the CPU.

After the first two-way block every prompt has its own keys x [4096, 256]. Block 1's token->image
attention, its image->token scores and the final token->image attention project x (k = x Wk^T + ..,
v = x Wv^T + .., q_img = x Wq^T + ..) only to take products with a few token vectors. The design runs
those products on x itself:

  token->image, head h:  q_h . k_j   = (Wk_h^T q_h) . x_j + q_h . pk_j,h + q_h . bk_h   (the last is
                         constant over j and drops out of the softmax; pk = pe Wk^T is the positional
                         share, the table the kernels already add on load)
                         sum_j p_j v_j = Wv_h (sum_j p_j x_j) + bv_h                 (rows of p sum to 1)
  image->token, head h:  q_img_j,h . k_t,h = x_j . (Wq_h^T k_t,h) + pq_j,h . k_t,h + bq_h . k_t,h

This script takes SAM's own Attention modules (the vendored original, random weights as in
WORKLOAD.md) and compares, against fp32, the module's output in bf16 (the current path rounds k, v
and q_img to bf16 after the projection) with the absorbed form in bf16 (the absorbed query rounded to
bf16 as an MMA operand, x in bf16, fp32 accumulation, the probabilities rounded to bf16 before the
value product, as ImageToTokenUpdate rounds them). It prints each error; it exits 1 when the absorbed
form is more than 1.5x further from fp32 than the module's bf16 path, or when the fp32 forms differ
by more than 1e-4 (the algebra itself).

  .venv/bin/python scripts/check-weight-absorption.py [path/to/segment_anything-1.0-py3-none-any.whl]
"""
import math
import os
import sys
import tempfile
import zipfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
WHEEL = os.path.join(HERE, "..", "..", "shared", "anchors", "vendor", "segment_anything-1.0-py3-none-any.whl")


def load_sam(wheel):
    tmp = tempfile.mkdtemp()
    zipfile.ZipFile(wheel).extractall(tmp)
    sys.path.insert(0, tmp)
    from segment_anything.modeling.transformer import TwoWayTransformer  # noqa: E402
    return TwoWayTransformer


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bf(t):
    return t.to(torch.bfloat16)


def heads(attn):
    h = attn.num_heads
    return h, attn.internal_dim // h


def t2i_module(attn, q_tok, x, pe, dtype):
    """SAM's module: q = tokens (+ their pe, already in q_tok), k = x + pe, v = x."""
    a = attn.to(dtype)
    out = a(q=q_tok.to(dtype), k=(x + pe).to(dtype), v=x.to(dtype))
    attn.float()
    return out.float()


def t2i_absorbed(attn, q_tok, x, pe, dtype):
    """The absorbed form: scores on x (256 wide) plus the positional share, the value product on x."""
    h, c = heads(attn)
    b, t, _ = q_tok.shape
    q = F.linear(q_tok, attn.q_proj.weight, attn.q_proj.bias).view(b, t, h, c)   # fp32, tiny
    wk = attn.k_proj.weight.view(h, c, -1)                                        # [H, c, 256]
    qa = torch.einsum("bthc,hcd->bhtd", q, wk)                                    # absorbed queries
    pk = F.linear(pe, attn.k_proj.weight).view(-1, h, c)                          # [HW, H, c], no bias
    # The MMA operands in the model dtype, fp32 accumulation.
    s = torch.einsum("bhtd,bjd->bhtj", qa.to(dtype).float(), x.to(dtype).float())
    s = s + torch.einsum("bthc,jhc->bhtj", q, pk.to(dtype).float())
    p = torch.softmax(s / math.sqrt(c), dim=-1)
    ox = torch.einsum("bhtj,bjd->bhtd", p.to(dtype).float(), x.to(dtype).float())  # [B, H, T, 256]
    wv = attn.v_proj.weight.view(h, c, -1)
    o = torch.einsum("bhtd,hcd->bthc", ox, wv) + attn.v_proj.bias.view(h, c)
    return F.linear(o.reshape(b, t, h * c), attn.out_proj.weight, attn.out_proj.bias)


def i2t_probs_module(attn, x, pe, k_tok, dtype):
    """The image->token probabilities as the current path makes them: q_img projected and rounded."""
    h, c = heads(attn)
    b, n, _ = x.shape
    q_img = F.linear((x + pe).to(dtype), attn.q_proj.weight.to(dtype), attn.q_proj.bias.to(dtype)).float()
    k = F.linear(k_tok.to(dtype), attn.k_proj.weight.to(dtype), attn.k_proj.bias.to(dtype)).float()
    s = torch.einsum("bjhc,bthc->bjht", q_img.view(b, n, h, c), k.view(b, -1, h, c))
    return torch.softmax(s / math.sqrt(c), dim=-1)


def i2t_probs_absorbed(attn, x, pe, k_tok, dtype):
    h, c = heads(attn)
    b, n, _ = x.shape
    k = F.linear(k_tok, attn.k_proj.weight, attn.k_proj.bias).view(b, -1, h, c)  # fp32, tiny
    wq = attn.q_proj.weight.view(h, c, -1)
    ka = torch.einsum("bthc,hcd->bthd", k, wq)                                    # absorbed token keys
    pq = F.linear(pe, attn.q_proj.weight).view(-1, h, c)                          # positional share
    s = torch.einsum("bjd,bthd->bjht", x.to(dtype).float(), ka.to(dtype).float())
    s = s + torch.einsum("jhc,bthc->bjht", pq.to(dtype).float(), k)
    s = s + torch.einsum("hc,bthc->bht", attn.q_proj.bias.view(h, c), k).unsqueeze(1)
    return torch.softmax(s / math.sqrt(c), dim=-1)


def main():
    wheel = sys.argv[1] if len(sys.argv) > 1 else WHEEL
    TwoWayTransformer = load_sam(wheel)
    torch.manual_seed(1)
    tr = TwoWayTransformer(depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8).eval()
    with torch.no_grad():  # a bf16 model: its weights bf16 values (the fp32 reference runs the same ones)
        for prm in tr.parameters():
            prm.copy_(prm.bfloat16().float())
    b, t, n = 4, 7, 4096
    torch.manual_seed(2)
    x = torch.randn(b, n, 256)           # a prompt's keys after block 0 (LayerNorm'd: O(1))
    pe = torch.randn(1, n, 256) * 0.5    # the dense positional encoding
    q_tok = torch.randn(b, t, 256)       # tokens + their pe
    k_tok = torch.randn(b, t, 256)
    def check(name, current, absorbed, *args):
        """Both forms in fp32 (the algebra) and in bf16 (the rounding), each against current's fp32."""
        ref, alg = current(*args, torch.float32), absorbed(*args, torch.float32)
        cur, new = current(*args, torch.bfloat16), absorbed(*args, torch.bfloat16)
        e_alg, e_cur, e_new = rel_l2(alg, ref), rel_l2(cur, ref), rel_l2(new, ref)
        print(f"{name}: fp32 absorbed vs projected {e_alg:.2e}; bf16 against fp32: projected {e_cur:.3e}, "
              f"absorbed {e_new:.3e}")
        return e_alg > 1e-4 or e_new > 1.5 * e_cur

    failed = False
    with torch.no_grad():
        for name, attn in (("block 1 token->image", tr.layers[1].cross_attn_token_to_image),
                           ("final token->image", tr.final_attn_token_to_image)):
            failed |= check(name, t2i_module, t2i_absorbed, attn, q_tok, x, pe)
        failed |= check("block 1 image->token probabilities", i2t_probs_module, i2t_probs_absorbed,
                        tr.layers[1].cross_attn_image_to_token, x, pe, k_tok)
    print("FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
