// The explain page (see explain_namespace.js), its figures: numbers and colours, and one layout
// of heatmaps, rectangles and text that two painters draw, as SVG markup or on a canvas.
(function (page) {
  "use strict";
  // ------------------------------------------------------------------ numbers and colours
  const CANVAS_ABOVE = 64; // a heatmap with more rows or columns than this is drawn on a canvas
  function fmt(v) {
    if (v === 0) return "0";
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    return a >= 1e-3 && a < 1e4 ? v.toPrecision(4) : v.toExponential(3);
  }
  function escapeText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
    [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  function between(a, b, t) { return [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }); }
  function stops(list, t) {
    const x = Math.min(Math.max(t, 0), 1) * (list.length - 1);
    const i = Math.min(Math.floor(x), list.length - 2);
    return between(list[i], list[i + 1], x - i);
  }
  function hex(rgb) { return "#" + rgb.map(function (c) { return c.toString(16).padStart(2, "0"); }).join(""); }
  const SEQUENTIAL = [], DIVERGING = [];
  for (let i = 0; i < 256; i++) {
    SEQUENTIAL.push(stops(VIRIDIS, i / 255));
    const t = i / 255 * 2 - 1; // blue (negative), white (0), red (positive)
    DIVERGING.push(t < 0 ? between([255, 255, 255], [33, 102, 172], -t) : between([255, 255, 255], [178, 24, 43], t));
  }
  const SEQUENTIAL_HEX = SEQUENTIAL.map(hex), DIVERGING_HEX = DIVERGING.map(hex);
  function colourIndex(v, scale, vmax) {
    const t = scale === "sequential" ? v / vmax : (v / vmax + 1) / 2;
    return Math.min(255, Math.max(0, Math.round((isFinite(t) ? t : 0.5) * 255)));
  }
  function maxAbs(values) {
    let m = 0;
    for (let i = 0; i < values.length; i++) m = Math.max(m, Math.abs(values[i]));
    return m;
  }

  // ------------------------------------------------------------------ figures: one layout, two painters
  // A Figure holds heatmaps, rectangles and text; toSVG() writes it as SVG markup (one <rect
  // class="cell"> per heatmap entry, its value in data-v) and draw(canvas) paints it.
  function Figure(width, height) {
    this.width = Math.ceil(width);
    this.height = Math.ceil(height);
    this.items = [];
  }
  Figure.prototype.heatmap = function (x, y, cell, spec) {
    const item = Object.assign({ type: "heatmap", x: x, y: y, cell: cell }, spec);
    this.items.push(item);
    return item;
  };
  Figure.prototype.rect = function (x, y, w, h, fill, extra) {
    this.items.push({ type: "rect", x: x, y: y, w: w, h: h, fill: fill, extra: extra || "" });
  };
  Figure.prototype.outline = function (x, y, w, h, colour) {
    this.items.push({ type: "outline", x: x, y: y, w: w, h: h, colour: colour });
  };
  Figure.prototype.text = function (x, y, text, options) {
    this.items.push(Object.assign({ type: "text", x: x, y: y, text: text, size: 11, anchor: "start", rotate: false,
      fill: "#1d2433" }, options || {}));
  };
  Figure.prototype.hit = function (x, y) {
    for (const item of this.items) {
      if (item.type !== "heatmap") continue;
      const c = Math.floor((x - item.x) / item.cell), r = Math.floor((y - item.y) / item.cell);
      if (r >= 0 && c >= 0 && r < item.rows && c < item.cols) return { item: item, r: r, c: c };
    }
    return null;
  };
  Figure.prototype.toSVG = function (attributes) {
    const parts = ['<svg width="' + this.width + '" height="' + this.height + '" viewBox="0 0 ' + this.width + " " +
      this.height + '" shape-rendering="crispEdges" ' + (attributes || "") + ">"];
    for (const item of this.items) {
      if (item.type === "heatmap") {
        const colours = item.scale === "sequential" ? SEQUENTIAL_HEX : DIVERGING_HEX;
        const q = item.quantity ? ' data-q="' + item.quantity + '"' : "";
        for (let r = 0; r < item.rows; r++) {
          for (let c = 0; c < item.cols; c++) {
            const v = item.values[r * item.cols + c];
            parts.push('<rect class="cell" x="' + (item.x + c * item.cell) + '" y="' + (item.y + r * item.cell) +
              '" width="' + item.cell + '" height="' + item.cell + '" fill="' +
              colours[colourIndex(v, item.scale, item.vmax)] + '" data-r="' + r + '" data-c="' + c + '" data-v="' +
              v + '"' + q + "></rect>");
          }
        }
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.cols * item.cell + '" height="' +
          item.rows * item.cell + '" fill="none" stroke="#9aa3b5" stroke-width="0.5"></rect>');
      } else if (item.type === "outline") {
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.w + '" height="' + item.h +
          '" fill="none" stroke="' + item.colour + '" stroke-width="2"></rect>');
      } else if (item.type === "rect") {
        parts.push('<rect x="' + item.x + '" y="' + item.y + '" width="' + item.w + '" height="' + item.h +
          '" fill="' + item.fill + '" ' + item.extra + "></rect>");
      } else {
        const turn = item.rotate ? ' transform="rotate(-90 ' + item.x + " " + item.y + ')"' : "";
        parts.push('<text x="' + item.x + '" y="' + item.y + '" font-size="' + item.size + '" font-family="sans-serif"' +
          ' text-anchor="' + item.anchor + '" fill="' + item.fill + '"' + (item.bold ? ' font-weight="bold"' : "") +
          turn + ">" + escapeText(item.text) + "</text>");
      }
    }
    parts.push("</svg>");
    return parts.join("");
  };
  Figure.prototype.draw = function (canvas) {
    canvas.width = this.width;
    canvas.height = this.height;
    const context = canvas.getContext("2d");
    context.fillStyle = "#ffffff";
    context.fillRect(0, 0, this.width, this.height);
    for (const item of this.items) {
      if (item.type === "heatmap") {
        const colours = item.scale === "sequential" ? SEQUENTIAL : DIVERGING;
        const image = context.createImageData(item.cols, item.rows);
        for (let i = 0; i < item.rows * item.cols; i++) {
          const rgb = colours[colourIndex(item.values[i], item.scale, item.vmax)];
          image.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * i);
        }
        const small = document.createElement("canvas");
        small.width = item.cols;
        small.height = item.rows;
        small.getContext("2d").putImageData(image, 0, 0);
        context.imageSmoothingEnabled = false;
        context.drawImage(small, item.x, item.y, item.cols * item.cell, item.rows * item.cell);
      } else if (item.type === "outline") {
        context.strokeStyle = item.colour;
        context.lineWidth = 2;
        context.strokeRect(item.x, item.y, item.w, item.h);
      } else if (item.type === "rect") {
        context.fillStyle = item.fill;
        context.fillRect(item.x, item.y, item.w, item.h);
      } else {
        context.save();
        context.fillStyle = item.fill;
        context.font = (item.bold ? "bold " : "") + item.size + "px sans-serif";
        context.textAlign = item.anchor === "middle" ? "center" : item.anchor;
        context.translate(item.x, item.y);
        if (item.rotate) context.rotate(-Math.PI / 2);
        context.fillText(item.text, 0, 0);
        context.restore();
      }
    }
  };
  // Puts the figure into `container`: SVG markup, or a canvas when it is large.
  function place(container, figure, large, attributes) {
    container.textContent = "";
    if (large) {
      const canvas = document.createElement("canvas");
      canvas.className = "heatmap";
      figure.draw(canvas);
      container.appendChild(canvas);
      return canvas;
    }
    container.innerHTML = figure.toSVG('class="heatmap" ' + (attributes || ""));
    return container.firstElementChild;
  }
  function isLarge(rows, cols) { return Math.max(rows, cols) > CANVAS_ABOVE; }

  // A heatmap with its token labels, title and colour legend, at (x, y) of a figure.
  function labelledHeatmap(figure, x, y, spec) {
    const labels = spec.cell >= 7;
    const size = Math.min(11, spec.cell - 1);
    const room = function (list) { // pixels for the longest label, about 0.62 em a character
      return 6 + Math.min(16, list.reduce(function (m, s) { return Math.max(m, String(s).length); }, 1)) * size * 0.62;
    };
    const left = spec.rowLabels && labels ? room(spec.rowLabels) : 0;
    const top = labels ? room(spec.colLabels) : 0;
    figure.text(x + left, y + 13, spec.title, { size: 12, bold: true });
    const item = figure.heatmap(x + left, y + 22 + top, spec.cell, spec);
    if (labels) {
      if (spec.rowLabels) {
        spec.rowLabels.forEach(function (label, r) {
          figure.text(x + left - 4, item.y + r * spec.cell + spec.cell * 0.75, label, { size: size, anchor: "end" });
        });
      }
      spec.colLabels.forEach(function (label, c) {
        figure.text(item.x + c * spec.cell + spec.cell * 0.75, item.y - 4, label, { size: size, rotate: true });
      });
    }
    const legendY = item.y + spec.rows * spec.cell + 10;
    const width = Math.max(120, Math.min(spec.cols * spec.cell, 240));
    for (let i = 0; i < 64; i++) {
      const t = i / 63;
      const colours = spec.scale === "sequential" ? SEQUENTIAL_HEX : DIVERGING_HEX;
      figure.rect(item.x + t * (width - width / 64), legendY, width / 64 + 0.5, 8, colours[Math.round(t * 255)]);
    }
    const low = spec.scale === "sequential" ? 0 : -spec.vmax;
    figure.text(item.x, legendY + 20, fmt(low), { size: 10 });
    figure.text(item.x + width, legendY + 20, fmt(spec.vmax), { size: 10, anchor: "end" });
    const titleWidth = spec.title.length * 7.2;
    return { item: item, width: left + Math.max(spec.cols * spec.cell, width, titleWidth), height: legendY + 24 - y };
  }
  Object.assign(page, { fmt: fmt, escapeText: escapeText, maxAbs: maxAbs, Figure: Figure, place: place,
    isLarge: isLarge, labelledHeatmap: labelledHeatmap });
})(window.tinyformerExplain);
