"""How a tile of keys and values reaches the shared memory `engine.cuda_chunk_attention`'s products read: the
pieces its kernel body leaves open (``/*DECLARATIONS*/``: the stages; ``/*FETCH*/``: ``fetch(stage, tile)``, a
tile's copies into a stage; ``/*CONVERT*/``: what a landed stage needs before the products read it; ``[BF]``: the
bf16 stage they read), for a bf16 cache (`BF16`: copied as it lies, two stages) and for an 8-bit store's rows
(`Q8`: bytes and scale words copied as they lie into two raw stages, then widened into one bf16 stage).
"""
from __future__ import annotations

BF16 = {"/*DECLARATIONS*/": r"""
  __shared__ __align__(16) unsigned short ks[2][TK][KP];  // two stages: keys and values as they lie (row = key)
  __shared__ __align__(16) unsigned short vs[2][TK][KP];
""", "/*FETCH*/": r"""  const size_t k0 = kvh * k_strides[1], v0 = kvh * v_strides[1];
  // A tile: 32 keys x 16 chunks of 8 halves, for keys and values, spread over the block's threads and
  // copied straight into the stage (keys past the split's end repeat its last key; no row sees them).
  auto fetch = [&](int st, int tile) {
    for (int idx = tid; idx < TK * 16; idx += blockDim.x) {
      const int key = idx >> 4, part = idx & 15;
      const size_t at = (size_t)min(tile + key, end - 1);
      codectx::cp_async16(&ks[st][key][part * 8], k + k0 + at * k_strides[2] + part * 8);
      codectx::cp_async16(&vs[st][key][part * 8], v + v0 + at * v_strides[2] + part * 8);
    }
  };
""", "/*CONVERT*/": "", "[BF]": "[st]"}

Q8 = {"/*DECLARATIONS*/": r"""
  // One bf16 stage the products read, and two stages of the 8-bit tile as it lies: key bytes, value bytes, then
  // per key a word of its two groups' scales and one of their biases, for keys and for values.
  __shared__ __align__(16) unsigned short ks[1][TK][KP];
  __shared__ __align__(16) unsigned short vs[1][TK][KP];
  __shared__ __align__(16) unsigned char raw[2][2 * TK * D + 4 * TK * 4];
""", "/*FETCH*/": r"""
  const unsigned char* kbytes = reinterpret_cast<const unsigned char*>(kq + kvh * kq_strides[1]);
  const unsigned char* vbytes = reinterpret_cast<const unsigned char*>(vq + kvh * vq_strides[1]);
  const size_t krow = kq_strides[2] * 4, vrow = vq_strides[2] * 4;  // bytes
  // 32-bit words: both groups' scales (or biases) of one key; the strides in words.
  const uint32_t* ksw = reinterpret_cast<const uint32_t*>(kscale + kvh * kscale_strides[1]);
  const uint32_t* kbw = reinterpret_cast<const uint32_t*>(kbias + kvh * kbias_strides[1]);
  const uint32_t* vsw = reinterpret_cast<const uint32_t*>(vscale + kvh * vscale_strides[1]);
  const uint32_t* vbw = reinterpret_cast<const uint32_t*>(vbias + kvh * vbias_strides[1]);
  const size_t ksr = kscale_strides[2] / 2, kbr = kbias_strides[2] / 2, vsr = vscale_strides[2] / 2,
               vbr = vbias_strides[2] / 2;
  // A tile: 32 keys x 8 chunks of 16 bytes, for keys and values, and 4 x 32 scale words, spread over the
  // block's threads (keys past the split's end repeat its last key; no row sees them).
  auto fetch = [&](int st, int tile) {
    for (int idx = tid; idx < 2 * TK * 8; idx += blockDim.x) {
      const int value = idx >> 8, key = (idx >> 3) & (TK - 1), part = idx & 7;
      const size_t at = (size_t)min(tile + key, end - 1);
      codectx::cp_async16(&raw[st][value * TK * D + key * D + part * 16],
                          (value ? vbytes + at * vrow : kbytes + at * krow) + part * 16);
    }
    if (tid < 4 * TK) {
      const int which = tid / TK, key = tid % TK;
      const size_t at = (size_t)min(tile + key, end - 1);
      const uint32_t* word = which == 0 ? ksw + at * ksr : which == 1 ? kbw + at * kbr
                           : which == 2 ? vsw + at * vsr : vbw + at * vbr;
      codectx::cp_async4(&raw[st][2 * TK * D + which * TK * 4 + key * 4], word);
    }
  };
  // A landed 8-bit stage widened into the bf16 one: bf16(scale * byte + bias), each thread a 16-byte chunk
  // (one group's) at a time.
  auto convert = [&](int st) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw[st][2 * TK * D]);
    for (int idx = tid; idx < 2 * TK * 8; idx += blockDim.x) {
      const int value = idx >> 8, key = (idx >> 3) & (TK - 1), part = idx & 7;
      const uint4 b = *reinterpret_cast<const uint4*>(&raw[st][value * TK * D + key * D + part * 16]);
      const uint32_t sw = words[2 * value * TK + key], bw = words[(2 * value + 1) * TK + key];
      const float scale = part < 4 ? __uint_as_float(sw << 16) : __uint_as_float(sw & 0xFFFF0000u);
      const float bias = part < 4 ? __uint_as_float(bw << 16) : __uint_as_float(bw & 0xFFFF0000u);
      uint32_t out[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word = i < 2 ? b.x : i < 4 ? b.y : i < 6 ? b.z : b.w;
        const int shift = (i & 1) * 16;
        out[i] = codectx::bf2(fmaf(scale, static_cast<float>((word >> shift) & 0xFFu), bias),
                              fmaf(scale, static_cast<float>((word >> (shift + 8)) & 0xFFu), bias));
      }
      uint4* dst = reinterpret_cast<uint4*>(value ? &vs[0][key][part * 16] : &ks[0][key][part * 16]);
      dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
      dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
  };
""", "/*CONVERT*/": """    convert(st);
    __syncthreads();
""", "[BF]": "[0]"}
