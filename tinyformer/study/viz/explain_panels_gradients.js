// The explain page (see explain_namespace.js), the panels of the gradients: 3, target tokens; 4,
// token saliency; 5, head sensitivity and attention rollout; 6, the gradient check; 7, the derivation.
(function (page) {
  "use strict";
  const { data, KINDS, pieces, outputs, tokenIndex, rowLabels, colLabels, block, fmt, escapeText, maxAbs,
    Figure, place, isLarge, labelledHeatmap, state, select, probabilities, sourceName, showTip, hideTip } = page;
  // ------------------------------------------------------------------ 3. target tokens
  function tokens() {
    const container = document.getElementById("tokens");
    if (!container.childElementCount) {
      const add = function (t, label, loss) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "token" + (t && !(t in tokenIndex) ? " missing" : "");
        button.dataset.token = t;
        const name = document.createElement("span");
        name.textContent = label;
        const small = document.createElement("small");
        small.textContent = fmt(loss);
        button.append(name, small);
        if (t && !(t in tokenIndex)) button.title = "saliency and sensitivity only: this page does not hold this token's own dL/dP and dL/dS";
        button.addEventListener("click", function () { select({ token: t }); });
        container.appendChild(button);
      };
      add(0, "L (all)", page.view.loss.total);
      outputs.forEach(function (piece, i) { add(i + 1, piece, page.view.loss.tokens[i]); });
    }
    container.querySelectorAll("button.token").forEach(function (b) {
      b.setAttribute("aria-pressed", String(Number(b.dataset.token) === state.token));
    });
    const tg = page.view.token_gradients, check = tg.sum_check;
    const worst = Object.keys(check).reduce(function (m, k) {
      return Math.max(m, check[k].max_abs_difference / Math.max(check[k].max_abs, 1e-300));
    }, 0);
    document.getElementById("sum-check").textContent = "Σₜ ∂ℓₜ/∂X = ∂L/∂X for X = P, S of every head and the " +
      "embeddings, computed over all " + outputs.length + " tokens in float64: largest difference " +
      fmt(worst) + " of the largest |∂L/∂X|. " + (tg.complete ? "The page holds every token's dL/dP and dL/dS; " +
      "its self-test sums them again." : "The page holds the dL/dP and dL/dS of tokens " + tg.positions.join(", ") +
      " (of " + outputs.length + ": " + tg.values.toLocaleString("en") + " numbers, at most " +
      tg.limit.toLocaleString("en") + " in all; tinyformer explain --tokens picks others).") +
      " Each token's dℓₜ/dP is stored in one byte a value (within 4.4 %), its dℓₜ/dS computed here from it.";
  }

  // ------------------------------------------------------------------ 4. saliency
  function saliency() {
    const container = document.getElementById("saliency");
    container.textContent = "";
    ["source", "target"].forEach(function (side) {
      const labels = side === "source" ? pieces.source : pieces.target;
      const norm = state.token ? block("token.saliency." + side + ".norm", [state.token - 1])
        : block("saliency." + side + ".norm", []);
      const gxi = state.token ? block("token.saliency." + side + ".gxi", [state.token - 1])
        : block("saliency." + side + ".gxi", []);
      const step = Math.max(4, Math.min(24, Math.floor(900 / labels.length)));
      const left = 110, barHeight = 46, figure = new Figure(left + labels.length * step + 10, 2 * barHeight + 100);
      figure.text(0, 12, side + " tokens (" + (side === "source" ? "encoder input" : "decoder input") + ")",
        { size: 12, bold: true });
      const nmax = maxAbs(norm) || 1, gmax = maxAbs(gxi) || 1;
      figure.text(left - 6, 24 + barHeight / 2, "‖g‖ (max " + fmt(nmax) + ")", { size: 10, anchor: "end" });
      figure.text(left - 6, 30 + barHeight * 1.5, "g·e (±" + fmt(gmax) + ")", { size: 10, anchor: "end" });
      labels.forEach(function (label, i) {
        const x = left + i * step, h = norm[i] / nmax * barHeight;
        figure.rect(x + 1, 20 + barHeight - h, step - 2, h, "#5b4fa8", 'class="bar" data-side="' + side +
          '" data-measure="norm" data-i="' + i + '" data-v="' + norm[i] + '"');
        const g = gxi[i] / gmax * barHeight / 2, middle = 26 + barHeight * 1.5;
        figure.rect(x + 1, g >= 0 ? middle - g : middle, step - 2, Math.abs(g), g >= 0 ? "#b2182b" : "#2166ac",
          'class="bar" data-side="' + side + '" data-measure="gxi" data-i="' + i + '" data-v="' + gxi[i] + '"');
        if (step >= 7) figure.text(x + step * 0.7, 32 + 2 * barHeight, label, { size: Math.min(11, step - 1), rotate: true, anchor: "end" });
      });
      figure.rect(left, 26 + barHeight * 1.5, labels.length * step, 0.6, "#9aa3b5");
      const holder = document.createElement("div");
      holder.className = "figure";
      holder.innerHTML = figure.toSVG('class="saliency" data-side="' + side + '"');
      holder.addEventListener("mousemove", function (event) {
        const bar = event.target.closest("rect.bar");
        if (!bar) return hideTip();
        const i = Number(bar.dataset.i);
        showTip(event, side + " token " + (i + 1) + " " + JSON.stringify(labels[i]) + "\n‖g‖ = " + fmt(norm[i]) +
          "\ng·e = " + fmt(gxi[i]) + "\nof " + sourceName(state.token));
      });
      holder.addEventListener("mouseleave", hideTip);
      container.appendChild(holder);
    });
  }

  // ------------------------------------------------------------------ 5. sensitivity and rollout
  function sensitivities(token) {
    const rows = [];
    KINDS.forEach(function (kind) {
      const info = data.kinds[kind];
      const values = token ? block("token.sensitivity." + kind, [token - 1]) : block("sensitivity." + kind, []);
      for (let layer = 1; layer <= info.layers; layer++) {
        for (let head = 1; head <= info.heads; head++) {
          rows.push({ kind: kind, layer: layer, head: head, value: values[(layer - 1) * info.heads + head - 1] });
        }
      }
    });
    return rows.sort(function (a, b) { return Math.abs(b.value) - Math.abs(a.value); });
  }
  function sensitivity() {
    const rows = sensitivities(state.token);
    const largest = Math.abs(rows[0].value) || 1;
    const table = document.createElement("table");
    table.id = "sensitivity-table";
    table.innerHTML = "<thead><tr><th>rank</th><th class=\"text\">attention</th><th>layer</th><th>head</th>" +
      "<th>Σ P∘∂" + (state.token ? "ℓ" + state.token : "L") + "/∂P</th><th class=\"text\"></th></tr></thead>";
    const body = document.createElement("tbody");
    rows.forEach(function (row, rank) {
      const tr = document.createElement("tr");
      tr.className = "clickable" + (row.kind === state.kind && row.layer === state.layer && row.head === state.head ?
        " current" : "");
      Object.assign(tr.dataset, { kind: row.kind, layer: row.layer, head: row.head, v: row.value });
      const width = Math.max(1, Math.round(Math.abs(row.value) / largest * 160));
      tr.innerHTML = "<td>" + (rank + 1) + "</td><td class=\"text\">" + escapeText(data.kinds[row.kind].name) +
        "</td><td>" + row.layer + "</td><td>" + row.head + "</td><td>" + fmt(row.value) + "</td><td class=\"text\">" +
        '<svg width="162" height="10"><rect x="0" y="1" width="' + width + '" height="8" class="' +
        (row.value >= 0 ? "bar-pos" : "bar-neg") + '"></rect></svg></td>';
      tr.addEventListener("click", function () { select({ kind: row.kind, layer: row.layer, head: row.head }); });
      body.appendChild(tr);
    });
    table.appendChild(body);
    const container = document.getElementById("sensitivity");
    container.textContent = "";
    container.appendChild(table);
  }
  function rolloutPanel() {
    const container = document.getElementById("rollout");
    [["enc", "encoder rollout (source × source)"], ["dec", "decoder self-attention rollout (target × target)"],
      ["cross", "cross rollout (target × source)"]].forEach(function (entry) {
      const kind = entry[0], info = data.kinds[kind];
      const values = block("rollout." + kind, []);
      const cell = Math.max(2, Math.min(16, Math.floor(260 / Math.max(info.rows, info.cols))));
      const figure = new Figure(1, 1);
      const placed = labelledHeatmap(figure, 4, 0, { title: entry[1], rows: info.rows, cols: info.cols, values: values,
        scale: "sequential", vmax: maxAbs(values) || 1, quantity: "rollout", cell: cell, rowLabels: rowLabels(kind),
        colLabels: colLabels(kind) });
      figure.width = Math.ceil(placed.width + 12);
      figure.height = Math.ceil(placed.height + 4);
      const holder = document.createElement("div");
      holder.className = "figure";
      const element = place(holder, figure, isLarge(info.rows, info.cols), 'data-rollout="' + kind + '"');
      element.dataset.rollout = kind;
      holder.addEventListener("mousemove", function (event) {
        const box = element.getBoundingClientRect();
        const hit = figure.hit(event.clientX - box.left, event.clientY - box.top);
        if (!hit) return hideTip();
        showTip(event, entry[1] + "\n" + JSON.stringify(rowLabels(kind)[hit.r]) + " → " +
          JSON.stringify(colLabels(kind)[hit.c]) + ": " + fmt(values[hit.r * info.cols + hit.c]));
      });
      holder.addEventListener("mouseleave", hideTip);
      container.appendChild(holder);
    });
  }

  // ------------------------------------------------------------------ 6. gradient check
  function verdicts() {
    const c = page.view.check;
    return c.rows.map(function (row) {
      return Math.abs(row.analytic - row.numeric) <= c.atol + c.rtol * Math.abs(row.numeric);
    });
  }
  function gradientCheck() {
    const c = page.view.check, passed = verdicts();
    const all = passed.every(Boolean);
    const badge = document.getElementById("gradcheck-badge");
    badge.dataset.status = all ? "pass" : "fail";
    badge.textContent = all ? "PASS" : "FAIL: " + passed.filter(function (p) { return !p; }).length + " of " +
      passed.length;
    document.getElementById("check-note").textContent = "Five-point differences (8·(L(x + h) − L(x − h)) − (L(x + 2h) − L(x − 2h))) / 12h " +
      "with h = " + c.eps + " in float64, on this sentence: for each kind of attention two entries of P and two of S in its most " +
      "sensitive head (the largest |gradient| and a random one); the gate of the most sensitive head of all (" +
      data.kinds[c.head.kind].name + ", layer " + c.head.layer + ", head " + c.head.head + ") and two elements of " +
      "each of its W_Q, W_K and W_V rows. Moving P_ij by h moves row i of the head's output O = P·V by h·V_j; moving " +
      "S_ij by h moves it by (softmax(S_i + h e_j) − P_i)·V. Pass when |analytic − numeric| ≤ " + c.atol + " + " +
      c.rtol + "·|numeric| (tinyformer.engine.gradcheck's rule).";
    const table = document.createElement("table");
    table.id = "check-table";
    table.innerHTML = "<thead><tr><th class=\"text\">what</th><th class=\"text\">attention</th><th>layer</th>" +
      "<th>head</th><th class=\"text\">index</th><th>analytic</th><th>numeric</th><th>abs error</th>" +
      "<th>rel error</th><th class=\"text\">result</th></tr></thead>";
    const body = document.createElement("tbody");
    c.rows.forEach(function (row, i) {
      const tr = document.createElement("tr");
      tr.className = passed[i] ? "" : "fail";
      tr.dataset.passed = String(passed[i]);
      tr.innerHTML = "<td class=\"text\">" + escapeText(row.what) + "</td><td class=\"text\">" +
        escapeText(data.kinds[row.kind].name) + "</td><td>" + row.layer + "</td><td>" + row.head +
        "</td><td class=\"text\">" + (row.index.length ? "[" + row.index.join(", ") + "]" : "ξ") + "</td><td>" +
        row.analytic.toExponential(9) + "</td><td>" + row.numeric.toExponential(9) + "</td><td>" +
        row.abs_error.toExponential(2) + "</td><td>" + row.rel_error.toExponential(2) + "</td><td class=\"text\">" +
        (passed[i] ? "pass" : "FAIL") + "</td>";
      body.appendChild(tr);
    });
    table.appendChild(body);
    document.getElementById("check").appendChild(table);
  }

  // ------------------------------------------------------------------ 7. the derivation
  function norm(values) {
    let s = 0;
    for (let i = 0; i < values.length; i++) s += values[i] * values[i];
    return Math.sqrt(s);
  }
  function vector(values) {
    return "[" + Array.prototype.map.call(values, fmt).join(", ") + "]";
  }
  function derivation() {
    const kind = state.kind, info = data.kinds[kind], l = state.layer - 1, h = state.head - 1;
    const dk = data.model.d_k;
    const dO = block("dO." + kind, [l, h]), V = block("V." + kind, [l, h]), Q = block("Q." + kind, [l, h]);
    const dQ = block("dQ." + kind, [l, h]), dK = block("dK." + kind, [l, h]), dV = block("dV." + kind, [l, h]);
    const P = probabilities(kind, state.layer, state.head);
    const dP = block("dP." + kind, [l, h]), dS = block("dS." + kind, [l, h]);
    const cols = info.cols, scale = 1 / Math.sqrt(dk);
    let row = state.row - 1;
    if (row < 0) { // the query whose scores get the most gradient
      let best = -1;
      for (let i = 0; i < info.rows; i++) {
        let n = 0;
        for (let j = 0; j < cols; j++) n += Math.abs(dS[i * cols + j]);
        if (n > best) { best = n; row = i; }
      }
    }
    let rowsum = 0;
    for (let j = 0; j < cols; j++) rowsum += P[row * cols + j] * dP[row * cols + j];
    const gaps = block("derivation." + kind, []);
    const gap = function (q) { return gaps[(q * info.layers + l) * info.heads + h]; };
    const keys = colLabels(kind);
    const visible = info.causal ? row + 1 : cols; // a causal row's later keys are masked: P = 0, so dS = 0
    const order = Array.from({ length: visible }, function (_, j) { return j; });
    const shown = visible > 24 ? order.sort(function (a, b) {
      return Math.abs(dS[row * cols + b]) - Math.abs(dS[row * cols + a]);
    }).slice(0, 24).sort(function (a, b) { return a - b; }) : order;
    let table = "<table id=\"derivation-table\"><thead><tr><th>j</th><th class=\"text\">key</th><th>P_ij</th>" +
      "<th>dP_ij = dO_i·V_j</th><th>P_ij·dP_ij</th><th>dS_ij = P_ij (dP_ij − r_i)</th><th>row i's share of " +
      "‖dV_j‖: ‖P_ij dO_i‖</th><th>of ‖dK_j‖: ‖dS_ij Q_i‖/√d_k</th></tr></thead><tbody>";
    let dsum = 0, qnorm = 0, onorm = 0;
    for (let d = 0; d < dk; d++) { qnorm += Q[row * dk + d] ** 2; onorm += dO[row * dk + d] ** 2; }
    for (let j = 0; j < cols; j++) dsum += dS[row * cols + j];
    shown.forEach(function (j) {
      const i = row * cols + j;
      table += "<tr data-j=\"" + (j + 1) + "\"><td>" + (j + 1) + "</td><td class=\"text\">" + escapeText(keys[j]) +
        "</td><td>" + fmt(P[i]) + "</td><td>" + fmt(dP[i]) + "</td><td>" + fmt(P[i] * dP[i]) + "</td><td>" +
        fmt(dS[i]) + "</td><td>" + fmt(Math.abs(P[i]) * Math.sqrt(onorm)) + "</td><td>" +
        fmt(Math.abs(dS[i]) * Math.sqrt(qnorm) * scale) + "</td></tr>";
    });
    table += "</tbody></table>";
    const name = info.name + ", layer " + state.layer + ", head " + state.head;
    const steps = [
      "<p class=\"derivation-step\">" + escapeText(name) + ", query row i = " + (row + 1) + " " +
        escapeText(JSON.stringify(rowLabels(kind)[row])) + ", the whole loss L" +
        (state.row ? "" : " (the row whose scores get the most gradient, Σ_j |dS_ij|; click a row of the heatmaps " +
        "for another)") + ".</p>",
      "<p class=\"derivation-step\"><span class=\"formula\">dO_i</span> = ∂L/∂O_i, the gradient at this row of the " +
        "head's output O = P·V (d_k = " + dk + "): <span class=\"vector\" id=\"derivation-dO\">" + vector(dO.subarray(row * dk, (row + 1) * dk)) + "</span></p>",
      "<p class=\"derivation-step\"><span class=\"formula\">r_i = Σ_j P_ij·dP_ij = " + fmt(rowsum) + "</span>; " +
        "<span class=\"formula\">Σ_j dS_ij = " + fmt(dsum) + "</span> (a softmax row's gradient sums to 0)" +
        (info.causal && visible < cols ? "; keys after i are masked (P_ij = 0, so dS_ij = 0 whatever dP_ij)" : "") +
        (shown.length < visible ? "; the " + shown.length + " keys of largest |dS_ij| of " + visible + ":" : ":") +
        "</p>",
      table,
      "<p class=\"derivation-step\"><span class=\"formula\">dQ_i = Σ_j dS_ij K_j / √d_k</span> = " +
        "<span class=\"vector\" id=\"derivation-dQ\">" + vector(dQ.subarray(row * dk, (row + 1) * dk)) + "</span></p>",
      "<p class=\"derivation-step\"><span class=\"formula\">dK = dSᵀ·Q/√d_k</span> and <span class=\"formula\">" +
        "dV = Pᵀ·dO</span> sum every query row's share: ‖dK‖ = " + fmt(norm(dK)) + ", ‖dV‖ = " +
        fmt(norm(dV)) + " for this head.</p>",
      "<p class=\"derivation-step\" id=\"derivation-gaps\">The engine's dQ, dK, dV (autograd through the fused " +
        "attention backward) against the formulas from the hook point's P and dP, largest difference over this head " +
        "(float64, in Python): dV " + fmt(gap(0)) + ", dP = dO·Vᵀ " + fmt(gap(1)) + ", dQ " + fmt(gap(2)) + ", dK " +
        fmt(gap(3)) + ".</p>",
    ];
    document.getElementById("derivation").innerHTML = steps.join("");
  }
  Object.assign(page, { tokens: tokens, saliency: saliency, sensitivity: sensitivity, rolloutPanel: rolloutPanel,
    verdicts: verdicts, gradientCheck: gradientCheck, derivation: derivation });
})(window.tinyformerExplain);
