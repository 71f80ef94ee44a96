(function () {
  "use strict";
  // BertViz's neuron view (Vig 2019): for one head and one query token, q, each k_j, q * k_j,
  // q . k_j * scale and the weight. Hover a query token (left) to switch the query.
  var root = document.getElementById("ROOT_ID");
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var d = JSON.parse(root.querySelector("script.mhsa-data").textContent);
  var L = d.L, H = d.H, M = d.m, N = d.n, D = d.d;
  function bytesOf(b64) {
    var raw = atob(b64), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return new DataView(out.buffer);
  }
  var wv = bytesOf(d.w), qv = bytesOf(d.q), kv = bytesOf(d.kv);
  function w(l, h, q, k) { return wv.getUint16(2 * (((l * H + h) * M + q) * N + k), true) / 65535; }
  function vec(view, rows, l, h, i) {
    var out = new Float64Array(D), at = 4 * (((l * H + h) * rows + i) * D);
    for (var c = 0; c < D; c++) out[c] = view.getFloat32(at + 4 * c, true);
    return out;
  }

  var theme = root.getAttribute("data-theme");
  var jpLight = document.body && document.body.getAttribute("data-jp-theme-light");
  var dark = theme === "dark" || (theme === "auto" && (jpLight === "false" ||
    (jpLight === null && window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches)));
  if (dark) root.classList.add("mhsa-dark");
  var zero = dark ? [24, 24, 27] : [255, 255, 255];
  var pos = dark ? [96, 165, 250] : [29, 78, 216], neg = dark ? [248, 113, 113] : [220, 38, 38];
  function signed(v, top) {  // blue above 0, red below, the background at 0
    var t = top > 0 ? Math.min(1, Math.abs(v) / top) : 0, end = v >= 0 ? pos : neg;
    return "rgb(" + [0, 1, 2].map(function (c) { return Math.round(zero[c] + (end[c] - zero[c]) * t); }).join(",") + ")";
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  var cell = Math.max(2, Math.floor(192 / D));
  function strip(values, top) {
    var c = el("canvas", "mhsa-vec");
    c.width = D * cell; c.height = 12;
    var ctx = c.getContext("2d");
    for (var i = 0; i < D; i++) { ctx.fillStyle = signed(values[i], top); ctx.fillRect(i * cell, 0, cell, 12); }
    return c;
  }

  var state = { l: d.layer, h: d.head, q: 0 };
  var bar = el("div", "mhsa-bar");
  function picker(label, names, key) {
    var wrap = el("label", null, label + " "), sel = el("select");
    names.forEach(function (name, i) { var o = el("option", null, name); o.value = i; sel.appendChild(o); });
    sel.value = state[key];
    sel.addEventListener("change", function () { state[key] = +sel.value; draw(); });
    wrap.appendChild(sel); bar.appendChild(wrap);
  }
  picker("Layer", d.layers, "l"); picker("Head", d.heads, "h");
  bar.appendChild(el("span", "mhsa-label", "hover a query token; blue > 0, red < 0 (vectors: scaled to the head's largest |value|)"));
  root.appendChild(bar);

  var main = el("div", "mhsa-main"), queries = el("div", "mhsa-queries"), detail = el("div", "mhsa-detail");
  var qSpans = d.queries.map(function (tok, i) {
    var s = el("div", "mhsa-tok mhsa-q", tok); s.setAttribute("data-i", i);
    s.addEventListener("mouseenter", function () { state.q = i; draw(); });
    queries.appendChild(s); return s;
  });
  var heading = el("div", "mhsa-heading"), table = el("table", "mhsa-neuron");
  detail.appendChild(heading); detail.appendChild(table);
  main.appendChild(queries); main.appendChild(detail); root.appendChild(main);

  function cellOf(tr, child, cls) { var td = el("td", cls); if (child) td.appendChild(child); tr.appendChild(td); return td; }
  function draw() {
    var l = state.l, h = state.h, i = state.q;
    qSpans.forEach(function (s, j) { s.classList.toggle("mhsa-from", j === i); });
    heading.textContent = d.layers[l] + d.heads[h] + ": query " + d.queries[i] + " (#" + i + ")";
    var q = vec(qv, M, l, h, i), keys = [], products = [], top = 0, topProduct = 0;
    for (var c = 0; c < D; c++) top = Math.max(top, Math.abs(q[c]));
    for (var j = 0; j < N; j++) {
      var k = vec(kv, N, l, h, j), p = new Float64Array(D);
      for (c = 0; c < D; c++) { p[c] = q[c] * k[c]; top = Math.max(top, Math.abs(k[c])); topProduct = Math.max(topProduct, Math.abs(p[c])); }
      keys.push(k); products.push(p);
    }
    while (table.firstChild) table.removeChild(table.firstChild);
    var head = el("tr");
    ["key", "k", "q × k", "q · k / √d", "weight"].forEach(function (t) { head.appendChild(el("th", null, t)); });
    table.appendChild(head);
    var qRow = el("tr", "mhsa-qrow");
    cellOf(qRow, el("span", null, "q: " + d.queries[i]), "mhsa-key");
    cellOf(qRow, strip(q, top));
    cellOf(qRow, null); cellOf(qRow, null); cellOf(qRow, null);
    table.appendChild(qRow);
    for (j = 0; j < N; j++) {
      var tr = el("tr", "mhsa-krow"), masked = d.causal && j > i;
      tr.setAttribute("data-k", j);
      if (masked) tr.classList.add("mhsa-masked");
      cellOf(tr, el("span", null, d.keys[j]), "mhsa-key");
      cellOf(tr, strip(keys[j], top));
      cellOf(tr, strip(products[j], topProduct));
      var score = 0;
      for (c = 0; c < D; c++) score += products[j][c];
      score *= d.scale;
      var scoreCell = cellOf(tr, null, "mhsa-score");
      scoreCell.textContent = masked ? "masked" : score.toFixed(3);
      if (!masked) scoreCell.style.color = signed(score, Math.abs(score));
      var weight = w(l, h, i, j), wCell = cellOf(tr, null, "mhsa-weight"), barEl = el("span", "mhsa-wbar");
      barEl.style.width = Math.round(60 * weight) + "px";
      wCell.appendChild(barEl); wCell.appendChild(el("span", "mhsa-wtext", weight.toFixed(3)));
      table.appendChild(tr);
    }
  }
  draw();
})();
