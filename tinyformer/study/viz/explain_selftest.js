// The explain page (see explain_namespace.js), its self-test: the page's numbers against their
// error bounds and Python's float64 samples, every head drawn, the exports, the slider; its
// verdict in #self-test's attributes.
(function (page) {
  "use strict";
  const { data, KINDS, STEPS, tokenPositions, useStep, cached, stored, storedError, probabilitiesOf,
    headGradient, tokenGradient, whole, fmt, state, gradient, exportSVG, exportCanvas, verdicts,
    sliderCheck } = page;
  // Error bounds: how far each of the page's numbers may be from the exact one, given the most that
  // storage moved its inputs (decodeArray's error), to first order and beyond (|xy − x̃ỹ| ≤
  // |x̃|e_y + |ỹ|e_x + e_x·e_y), with 2⁻⁴⁰ of the terms' size for float64 arithmetic on both sides.
  const EPS = Math.pow(2, -53), SLACK = Math.pow(2, -40);
  function probabilityError(kind, l, h) { // P̂ = P̃/s, s = Σ_k P̃_k; the true row sums to 1
    return cached("eP." + kind + "." + l + "." + h, function () {
      const info = data.kinds[kind], raw = stored("P." + kind, [l, h]), e = storedError("P." + kind, [l, h]);
      const out = new Float64Array(raw.length), cols = info.cols;
      for (let i = 0; i < info.rows; i++) {
        let s = 0, spread = 0;
        for (let j = 0; j < cols; j++) { s += raw[i * cols + j]; spread += e[i * cols + j]; }
        for (let j = 0; j < cols; j++) {
          const k = i * cols + j;
          out[k] = s > 0 ? (e[k] + (Math.abs(raw[k]) + e[k]) * spread) / s + SLACK * Math.abs(raw[k]) : e[k];
        }
      }
      return out;
    });
  }
  // Σ_k a_k·b_k's bound, for a (n × d) row i and b (m × d) row j, strides given.
  function dotError(a, ea, b, eb, length, ai, as, bi, bs) {
    let bound = 0, size = 0;
    for (let k = 0; k < length; k++) {
      const x = a[ai + k * as], y = b[bi + k * bs], ex = ea[ai + k * as], ey = eb[bi + k * bs];
      bound += Math.abs(x) * ey + Math.abs(y) * ex + ex * ey;
      size += Math.abs(x * y);
    }
    return bound + SLACK * size;
  }
  function softmaxBackwardError(P, eP, dP, edP, rows, cols) {
    const out = new Float64Array(rows * cols);
    for (let i = 0; i < rows; i++) {
      const o = i * cols;
      let m = 0;
      for (let j = 1; j < cols; j++) if (P[o + j] > P[o + m]) m = j;
      let r = 0, er = 0, size = 0;
      for (let j = 0; j < cols; j++) {
        const c = dP[o + j] - dP[o + m], ec = j === m ? 0 : edP[o + j] + edP[o + m];
        r += P[o + j] * c;
        er += eP[o + j] * Math.abs(c) + (P[o + j] + eP[o + j]) * ec;
        size += Math.abs(P[o + j] * c);
      }
      for (let j = 0; j < cols; j++) {
        const c = dP[o + j] - dP[o + m], ec = j === m ? 0 : edP[o + j] + edP[o + m];
        out[o + j] = eP[o + j] * Math.abs(c - r) + (P[o + j] + eP[o + j]) * (ec + er) +
          SLACK * (P[o + j] * (Math.abs(c) + size) + Math.abs(P[o + j] * c));
      }
    }
    return out;
  }
  // One query row i of the bound of the page's dP, dS or token.dS (with `ti`) at a head (cols numbers).
  function errorRow(quantity, kind, ti, l, h, i) {
    return cached("e" + quantity + "." + kind + "." + ti + "." + l + "." + h + "." + i, function () {
      const info = data.kinds[kind], cols = info.cols, dk = data.model.d_k;
      if (quantity === "dP") {
        const dO = stored("dO." + kind, [l, h]), eO = storedError("dO." + kind, [l, h]);
        const V = stored("V." + kind, [l, h]), eV = storedError("V." + kind, [l, h]);
        const out = new Float64Array(cols);
        for (let j = 0; j < cols; j++) out[j] = dotError(dO, eO, V, eV, dk, i * dk, 1, j * dk, 1);
        return out;
      }
      const P = probabilitiesOf(kind, l, h), eP = probabilityError(kind, l, h);
      const token = quantity === "token.dS";
      const dP = token ? stored("token.dP." + kind, [ti, l, h]) : headGradient("dP", kind, l, h);
      const edP = token ? storedError("token.dP." + kind, [ti, l, h]).subarray(i * cols, (i + 1) * cols)
        : errorRow("dP", kind, 0, l, h, i);
      return softmaxBackwardError(P.subarray(i * cols, (i + 1) * cols), eP.subarray(i * cols, (i + 1) * cols),
        dP.subarray(i * cols, (i + 1) * cols), edP, 1, cols);
    });
  }
  // The bound of a whole head (rows × cols) of dP, dS or token.dS.
  function errorOf(quantity, kind, ti, l, h) {
    const info = data.kinds[kind], out = new Float64Array(info.rows * info.cols);
    for (let i = 0; i < info.rows; i++) out.set(errorRow(quantity, kind, ti, l, h, i), i * info.cols);
    return out;
  }
  // The bound of one entry of the page's dQ (at query row r), dK or dV (at key row r), column d.
  function projectionError(quantity, kind, l, h, r, d) {
    const info = data.kinds[kind], rows = info.rows, cols = info.cols, dk = data.model.d_k, scale = 1 / Math.sqrt(dk);
    if (quantity === "dV") {
      return dotError(probabilitiesOf(kind, l, h), probabilityError(kind, l, h), stored("dO." + kind, [l, h]),
        storedError("dO." + kind, [l, h]), rows, r, cols, d, dk);
    }
    const dS = headGradient("dS", kind, l, h);
    if (quantity === "dQ") {
      return scale * dotError(dS.subarray(r * cols, (r + 1) * cols), errorRow("dS", kind, 0, l, h, r),
        stored("K." + kind, [l, h]), storedError("K." + kind, [l, h]), cols, 0, 1, d, dk);
    }
    return scale * dotError(dS, errorOf("dS", kind, 0, l, h), stored("Q." + kind, [l, h]),
      storedError("Q." + kind, [l, h]), rows, r, cols, d, dk);
  }
  // The page's value of a sample (view.samples[name], a flat index into the Python side's array) and its bound.
  function sampleOf(name, flat) {
    const parts = name.split("."), token = parts[0] === "token", quantity = token ? "token." + parts[1] : parts[0];
    const kind = parts[parts.length - 1], info = data.kinds[kind], dk = data.model.d_k;
    const inner = quantity === "dQ" ? info.rows * dk : quantity === "dK" || quantity === "dV" ? info.cols * dk : info.rows * info.cols;
    let head = Math.floor(flat / inner);
    const at = flat % inner, h = head % info.heads;
    head = Math.floor(head / info.heads);
    const l = head % info.layers, ti = Math.floor(head / info.layers);
    const values = token ? tokenGradient(parts[1], kind, ti, l, h) : headGradient(quantity, kind, l, h);
    const bound = quantity === "dQ" || quantity === "dK" || quantity === "dV"
      ? projectionError(quantity, kind, l, h, Math.floor(at / dk), at % dk)
      : errorRow(quantity, kind, ti, l, h, Math.floor(at / info.cols))[at % info.cols];
    return { value: values[at], bound: bound };
  }
  // Every check of the numbers of the step shown, reported through `check(name, passed, detail)`.
  function stepChecks(check) {
    let rowSum = 0, scoreSum = 0, above = 0, tokenSum = 0;
    const held = tokenPositions.length;
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind], rows = info.rows, cols = info.cols;
      for (let l = 0; l < info.layers; l++) {
        for (let h = 0; h < info.heads; h++) {
          const raw = stored("P." + kind, [l, h]), e = storedError("P." + kind, [l, h]), P = probabilitiesOf(kind, l, h);
          const scores = [headGradient("dS", kind, l, h), headGradient("dP", kind, l, h)];
          for (let t = 0; t < held; t++) scores.push(tokenGradient("dS", kind, t, l, h), tokenGradient("dP", kind, t, l, h));
          for (let i = 0; i < rows; i++) {
            let s = 0, spread = 0;
            for (let j = 0; j < cols; j++) {
              s += raw[i * cols + j];
              spread += e[i * cols + j];
              if (info.causal && j > i && P[i * cols + j] !== 0) above++;
            }
            rowSum = Math.max(rowSum, Math.abs(s - 1) / spread); // the stored row sums to 1 within its precision
            // Each row of the page's dS sums to 0 to float64 rounding of its own terms, judged by their
            // size computed here again (centred, as the formula must be for saturated rows).
            for (let g = 0; g < scores.length; g += 2) {
              const dS = scores[g], dP = scores[g + 1];
              let m = 0, sum = 0, r = 0, size = 0;
              for (let j = 1; j < cols; j++) if (P[i * cols + j] > P[i * cols + m]) m = j;
              for (let j = 0; j < cols; j++) {
                const c = dP[i * cols + j] - dP[i * cols + m];
                r += P[i * cols + j] * c;
                size += Math.abs(P[i * cols + j] * c);
                sum += dS[i * cols + j];
                if (info.causal && j > i && dS[i * cols + j] !== 0) above++;
              }
              const limit = (4 * cols + 4) * EPS * (size + Math.abs(r));
              scoreSum = Math.max(scoreSum, sum === 0 ? 0 : Math.abs(sum) / limit);
            }
          }
          if (page.view.token_gradients.complete) { // Σₜ dℓₜ/dX = dL/dX, within the bounds of both sides
            ["dP", "dS"].forEach(function (grad) {
              const whole = headGradient(grad, kind, l, h), bound = errorOf(grad, kind, 0, l, h);
              const sum = new Float64Array(whole.length), allowed = new Float64Array(bound);
              for (let t = 0; t < held; t++) {
                const part = tokenGradient(grad, kind, t, l, h);
                const e = grad === "dP" ? storedError("token.dP." + kind, [t, l, h]) : errorOf("token.dS", kind, t, l, h);
                for (let k = 0; k < part.length; k++) { sum[k] += part[k]; allowed[k] += e[k]; }
              }
              for (let k = 0; k < sum.length; k++) {
                const gap = Math.abs(sum[k] - whole[k]);
                if (gap > 0) tokenSum = Math.max(tokenSum, gap / (allowed[k] + SLACK * Math.abs(whole[k])));
              }
            });
          }
        }
      }
    });
    check("P rows sum to 1", rowSum <= 1, "largest |Σ_j P_ij − 1| / Σ_j e_ij = " + fmt(rowSum) +
      " (passes up to 1; e_ij the most float16 storage moves P_ij)");
    check("dL/dS rows sum to 0", scoreSum <= 1, "largest |Σ_j dS_ij| / ((4n + 4)·2⁻⁵³·(Σ_j |P_ij (dP_ij − dP_im)| + " +
      "|r_i|)) = " + fmt(scoreSum) + " (passes up to 1: float64 rounding of the row's own terms, whole loss and " +
      "every held token)");
    check("causal: decoder self-attention P and dL/dS are 0 above the diagonal", above === 0, above + " entries");
    if (page.view.token_gradients.complete) {
      check("Σ over tokens of the per-token dL/dP, dL/dS = the whole loss's", tokenSum <= 1, "largest |Σₜ − whole| / " +
        "its bound = " + fmt(tokenSum) + " (passes up to 1; the bound adds what storage allows each side)");
    }
    let worstRatio = 0, worstGap = 0, where = "", count = 0;
    Object.keys(page.view.samples).forEach(function (name) {
      const sample = page.view.samples[name];
      sample.index.forEach(function (flat, k) {
        const found = sampleOf(name, flat), gap = Math.abs(found.value - sample.value[k]);
        const ratio = gap === 0 ? 0 : gap / found.bound;
        count++;
        if (!(ratio <= worstRatio)) { worstRatio = ratio; where = name + "[" + flat + "]"; }
        worstGap = Math.max(worstGap, gap);
      });
    });
    check("this page's dP, dS, dQ, dK, dV and per-token dS against Python's float64", worstRatio <= 1, count +
      " entries: largest |page − float64| " + fmt(worstGap) + "; largest share of its bound " + fmt(worstRatio) +
      (where ? " (" + where + ")" : "") + "; passes up to 1");
    const tg = page.view.token_gradients;
    const python = Object.keys(tg.sum_check).every(function (k) {
      return tg.sum_check[k].max_abs_difference <= 1e-8 * Math.max(1, tg.sum_check[k].max_abs);
    });
    check("Python's float64 Σₜ check over all tokens", python, JSON.stringify(tg.sum_check));
    const passed = verdicts();
    check("gradient-check verdicts agree with the Python side", passed.every(function (p, i) {
      return p === page.view.check.rows[i].passed;
    }) && passed.every(Boolean) === page.view.check.passed, "");
  }
  function selfTest() {
    const checks = [];
    // With several steps, a check passes when it passes at every step; its detail says each step's.
    const check = function (name, passed, detail) {
      const text = STEPS.length > 1 ? "step " + page.view.step + ": " + detail : detail;
      const found = checks.filter(function (c) { return c.name === name; })[0];
      if (found) {
        found.passed = found.passed && Boolean(passed);
        found.detail += " | " + text;
      } else {
        checks.push({ name: name, passed: Boolean(passed), detail: text });
      }
    };
    check("schema", data.schema === "tinyformer-explain" && data.version === 2, data.schema + " " + data.version);
    const shown = page.current;
    for (let k = 0; k < STEPS.length; k++) {
      useStep(k);
      stepChecks(check);
    }
    useStep(shown);
    let cellsOk = true;
    const cells = {};
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const thumbs = document.querySelectorAll('.thumb[data-kind="' + kind + '"]');
      let count = 0;
      thumbs.forEach(function (t) {
        count += t.tagName.toLowerCase() === "svg" ? t.querySelectorAll("rect.cell").length : Number(t.dataset.rows) * Number(t.dataset.cols);
      });
      cells[kind] = count;
      cellsOk = cellsOk && thumbs.length === info.layers * info.heads && count === info.layers * info.heads * info.rows * info.cols;
    });
    check("every layer and head drawn", cellsOk, JSON.stringify(cells));
    if (STEPS.length > 1) sliderCheck(check);
    const svg = exportSVG();
    const info = data.kinds[state.kind];
    const expected = info.rows * info.cols * (gradient(state.grad, state.kind, state.layer, state.head, state.token) ? 2 : 1);
    const exported = (svg.match(/class="cell"/g) || []).length;
    check("SVG export of this view", svg.indexOf("<svg") >= 0 && svg.indexOf("xmlns=") >= 0 && exported === expected,
      exported + " cells, " + svg.length + " characters");
    const png = exportCanvas().toDataURL("image/png");
    check("PNG export of this view", png.indexOf("data:image/png;base64,") === 0 && png.length > 100, png.length + " characters");
    const digest = {};
    const sums = function (values) {
      let s = 0, a = 0;
      for (let i = 0; i < values.length; i++) { s += values[i]; a += Math.abs(values[i]); }
      return [s, a];
    };
    Object.keys(page.arrays).forEach(function (name) { digest[name] = sums(page.arrays[name].values); });
    KINDS.forEach(function (kind) {
      ["P", "dP", "dS", "dQ", "dK", "dV", "token.dP", "token.dS"].forEach(function (name) {
        digest["page:" + name + "." + kind] = sums(whole(name + "." + kind));
      });
    });
    const errors = window.explainErrors || [];
    const ok = checks.every(function (c) { return c.passed; }) && errors.length === 0;
    const status = document.getElementById("self-test");
    status.setAttribute("data-checks", JSON.stringify(checks));
    status.setAttribute("data-errors", JSON.stringify(errors));
    status.setAttribute("data-digest", JSON.stringify(digest));
    status.setAttribute("data-cells", JSON.stringify(cells));
    status.setAttribute("data-ms", String(Math.round(performance.now() - page.started)));
    status.setAttribute("data-status", ok ? "pass" : "fail");
    status.textContent = ok ? "pass (" + checks.length + " checks)" : "failed: " + checks.filter(function (c) {
      return !c.passed;
    }).map(function (c) { return c.name + " (" + c.detail + ")"; }).concat(errors).join("; ");
  }
  page.selfTest = selfTest;
})(window.tinyformerExplain);
