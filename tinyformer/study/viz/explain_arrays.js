// The explain page (see explain_namespace.js), its arrays: an entry of the data decoded into
// float64 with the most each number may be off, and the linear algebra of attention's backward.
(function (page) {
  "use strict";
  const { inflate } = page;
  // The page stores what cannot be recomputed (tinyformer.study.viz.explain_codec): P, Q, K, V and dO of
  // every head as float16 scaled per head by a power of two, each token's dℓₜ/dP in one byte a value
  // (log8), the small arrays as float32. It derives the rest (explain_numbers.js), in float64, as the backward of
  // attention does (explain_codec.recompute is the same in Python): dP = dO·Vᵀ, dS (softmax's
  // backward), dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k, dV = Pᵀ·dO, and each token's dℓₜ/dS.
  const HALF = new Float64Array(65536), HALF_ERROR = new Float64Array(65536);
  for (let h = 0; h < 65536; h++) {
    const e = (h >> 10) & 31, m = h & 1023;
    const v = e === 0 ? m * Math.pow(2, -24) : e === 31 ? (m ? NaN : Infinity) : (1024 + m) * Math.pow(2, e - 25);
    HALF[h] = h & 32768 ? -v : v;
    HALF_ERROR[h] = e === 0 ? Math.pow(2, -25) : Math.pow(2, e - 26); // half a unit in the last place
  }
  const LOG8 = new Float64Array(256);
  // An entry's bytes: base64, inflated, and its byte planes (every value's first byte, then every
  // second, ...) put back together.
  function bytesOf(entry) {
    const text = atob(entry.base64);
    const packed = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) packed[i] = text.charCodeAt(i);
    const planes = inflate(packed, entry.bytes), width = entry.deflate, count = planes.length / width;
    if (width === 1) return planes;
    const bytes = new Uint8Array(planes.length);
    for (let b = 0; b < width; b++) for (let i = 0; i < count; i++) bytes[i * width + b] = planes[b * count + i];
    return bytes;
  }
  function stridesOf(shape) {
    const strides = [];
    let size = 1;
    for (let axis = shape.length - 1; axis >= 0; axis--) {
      strides[axis] = size;
      size *= shape[axis];
    }
    return { strides: strides, size: size };
  }
  // {shape, strides, values, error}: the stored numbers in float64 and the most each may be off.
  function decodeArray(entry, positions, bytes) {
    const layout = stridesOf(entry.shape), size = layout.size;
    const values = new Float64Array(size), error = new Float64Array(size);
    if (entry.encoding === "float32") {
      values.set(new Float32Array(bytes.buffer, 0, size));
      for (let i = 0; i < size; i++) error[i] = Math.max(Math.abs(values[i]) * Math.pow(2, -23), Math.pow(2, -150));
    } else if (entry.encoding === "float16") {
      // With `causal`, a block stores its lower triangle only (row by row); the rest is exactly 0.
      const n = entry.causal ? entry.shape[entry.shape.length - 1] : 0, blocks = entry.exponents.length;
      const per = size / blocks, halves = new Uint16Array(bytes.buffer, 0, bytes.length / 2);
      let k = 0;
      for (let b = 0; b < blocks; b++) {
        const scale = Math.pow(2, entry.exponents[b]);
        for (let i = 0; i < per; i++) {
          if (n && i % n > Math.floor(i / n)) continue;
          values[b * per + i] = HALF[halves[k]] * scale;
          error[b * per + i] = HALF_ERROR[halves[k]] * scale;
          k++;
        }
      }
    } else if (entry.encoding === "log8") {
      const [tokens, layers, heads, rows, cols] = entry.shape;
      const relative = Math.pow(2, 0.5 / entry.steps) - 1;
      for (let k = 0; k < 256; k++) LOG8[k] = (k & 127) ? (k & 128 ? -1 : 1) * Math.pow(2, -((k & 127) - 1) / entry.steps) : 0;
      let offset = 0, index = 0;
      for (let t = 0; t < tokens; t++) {
        const kept = entry.causal ? positions[t] + 1 : rows;
        for (let b = 0; b < layers * heads; b++, index++) {
          const scale = Math.pow(2, entry.exponents[index]), floor = scale * Math.pow(2, -(126.5 / entry.steps));
          const base = (t * layers * heads + b) * rows * cols;
          for (let i = 0; i < kept * cols; i++) {
            const v = LOG8[bytes[offset + i]] * scale;
            values[base + i] = v;
            error[base + i] = v ? Math.abs(v) * relative : floor;
          }
          for (let i = kept * cols; i < rows * cols; i++) error[base + i] = 0; // rows after the token: exactly 0
          offset += kept * cols;
        }
      }
    } else {
      throw new Error("unknown array encoding " + entry.encoding);
    }
    return { shape: entry.shape, strides: layout.strides, values: values, error: error };
  }
  // c = a·bᵀ for a (n × d), b (m × d): (n × m); with `transposeA`, aᵀ·b for a (k × n), b (k × m).
  function matmulT(a, b, n, m, d) {
    const c = new Float64Array(n * m);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < m; j++) {
        let s = 0;
        for (let k = 0; k < d; k++) s += a[i * d + k] * b[j * d + k];
        c[i * m + j] = s;
      }
    }
    return c;
  }
  function matmulTA(a, b, k, n, m) {
    const c = new Float64Array(n * m);
    for (let r = 0; r < k; r++) {
      for (let i = 0; i < n; i++) {
        const x = a[r * n + i];
        if (x === 0) continue;
        for (let j = 0; j < m; j++) c[i * m + j] += x * b[r * m + j];
      }
    }
    return c;
  }
  // dS = P∘(dP − rowsum(P∘dP)) row by row, dP centred at the row's most probable key m first (as
  // Σ_j P_ij = 1 this changes nothing, but nothing of dP's size cancels: a saturated row keeps
  // its tiny true values; explain_codec.softmax_backward).
  function softmaxBackward(P, dP, rows, cols) {
    const dS = new Float64Array(rows * cols);
    for (let i = 0; i < rows; i++) {
      const o = i * cols;
      let m = 0;
      for (let j = 1; j < cols; j++) if (P[o + j] > P[o + m]) m = j;
      const centre = dP[o + m];
      let r = 0;
      for (let j = 0; j < cols; j++) r += P[o + j] * (dP[o + j] - centre);
      for (let j = 0; j < cols; j++) dS[o + j] = P[o + j] * ((dP[o + j] - centre) - r);
    }
    return dS;
  }
  function transpose(a, rows, cols) {
    const t = new Float64Array(a.length);
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) t[j * rows + i] = a[i * cols + j];
    return t;
  }
  Object.assign(page, { bytesOf: bytesOf, decodeArray: decodeArray, matmulT: matmulT, matmulTA: matmulTA,
    transpose: transpose, softmaxBackward: softmaxBackward });
})(window.tinyformerExplain);
