"""Compile every kernel for an sm_90 target without a GPU (run as a script, interpreter OFF).

The interpreter accepts code that real compilation rejects; this lowers each kernel to PTX
through Triton's real front end, so such mistakes show up on a machine without a GPU.
"""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from twinserve.kernels.kv_store import _store_kv_kernel
from twinserve.kernels.paged_attention import _paged_attention_kernel
from twinserve.kernels.split_kv import _reduce_splits_kernel

TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(fn, pointer_types: dict[str, str], constexprs: dict[str, object], **options: int) -> int:
    """Lower ``fn`` to PTX; non-pointer runtime arguments are typed i32 unless given."""
    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else pointer_types.get(n, "i32") for n in names}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return len(triton.compile(src, target=TARGET, options=options).asm["ptx"])


def main() -> int:
    """Compile attention (decode, prefill, split), reduction and store variants."""
    for dtype in ("bf16", "fp16", "fp32"):
        for group, head_dim, block_m, splits in ((4, 128, 16, 1), (3, 64, 64, 1), (8, 128, 16, 8), (1, 64, 16, 2)):
            ptrs = {"query_ptr": f"*{dtype}", "key_cache_ptr": f"*{dtype}", "value_cache_ptr": f"*{dtype}",
                    "out_ptr": f"*{dtype}" if splits == 1 else "*fp32", "lse_ptr": "*fp32",
                    "block_tables_ptr": "*i32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
                    "qk_scale_log2": "fp32"}
            consts = dict(GROUP=group, HEAD_DIM=head_dim, DIM_PAD=head_dim, BLOCK_SIZE=16, BLOCK_M=block_m,
                          BLOCK_Q=block_m // group, BLOCK_N=64, NUM_SPLITS=splits, FP32_IEEE=dtype == "fp32")
            compile_kernel(_paged_attention_kernel, ptrs, consts, num_warps=4, num_stages=2)
    compile_kernel(_reduce_splits_kernel,
                   {"partial_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*bf16", "query_start_loc_ptr": "*i32"},
                   dict(HEAD_DIM=128, DIM_PAD=128, NUM_SPLITS=8, SPLITS_PAD=8))
    compile_kernel(_store_kv_kernel,
                   {"key_ptr": "*bf16", "value_ptr": "*bf16", "key_cache_ptr": "*bf16", "value_cache_ptr": "*bf16",
                    "slot_mapping_ptr": "*i64"},
                   dict(HEADS_PAD=8, DIM_PAD=128))
    print("compiled all kernels for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
