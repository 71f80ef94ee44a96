(function () {
  "use strict";
  var root = document.getElementById("ROOT_ID");
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var d = JSON.parse(root.querySelector("script.mhsa-data").textContent);
  var L = d.L, H = d.H, M = d.m, N = d.n;
  var raw = atob(d.w), bytes = new Uint8Array(raw.length);
  for (var b = 0; b < raw.length; b++) bytes[b] = raw.charCodeAt(b);
  var dv = new DataView(bytes.buffer);
  function w(l, h, q, k) { return dv.getUint16(2 * (((l * H + h) * M + q) * N + k), true) / 65535; }

  var theme = root.getAttribute("data-theme");
  var jpLight = document.body && document.body.getAttribute("data-jp-theme-light");
  var dark = theme === "dark" || (theme === "auto" && (jpLight === "false" ||
    (jpLight === null && window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches)));
  if (dark) root.classList.add("mhsa-dark");
  var lo = dark ? [24, 24, 27] : [255, 255, 255], hi = dark ? [253, 224, 71] : [29, 78, 216];
  function rgb(v) {
    return [0, 1, 2].map(function (c) { return Math.round(lo[c] + (hi[c] - lo[c]) * v); });
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function paint(canvas, l, h) {
    canvas.width = N; canvas.height = M;
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(N, M);
    for (var q = 0; q < M; q++) for (var k = 0; k < N; k++) {
      var c = rgb(w(l, h, q, k)), i = 4 * (q * N + k);
      img.data[i] = c[0]; img.data[i + 1] = c[1]; img.data[i + 2] = c[2]; img.data[i + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  var state = { l: d.layer, h: d.head, view: d.view, from: -1 };
  var bar = el("div", "mhsa-bar");
  function picker(label, names, key) {
    var wrap = el("label", null, label + " "), sel = el("select");
    names.forEach(function (name, i) { var o = el("option", null, name); o.value = i; sel.appendChild(o); });
    sel.addEventListener("change", function () {
      var v = +sel.value;
      select(key === "l" ? v : state.l, key === "h" ? v : state.h);
    });
    wrap.appendChild(sel); bar.appendChild(wrap); return sel;
  }
  var layerSel = picker("Layer", d.layers, "l"), headSel = picker("Head", d.heads, "h");
  var viewSel = el("select");
  [["heads", "map"], ["line", "lines"]].forEach(function (v) {
    var o = el("option", null, v[1]); o.value = v[0]; viewSel.appendChild(o);
  });
  viewSel.value = state.view;
  viewSel.addEventListener("change", function () { state.view = viewSel.value; draw(); });
  var viewWrap = el("label", null, "Show "); viewWrap.appendChild(viewSel); bar.appendChild(viewWrap);
  bar.appendChild(el("span", "mhsa-label", "click a head to enlarge it; hover a token to see where it attends"));
  root.appendChild(bar);

  var main = el("div", "mhsa-main"), grid = el("div", "mhsa-grid");
  grid.style.gridTemplateColumns = "auto repeat(" + H + ", auto)";
  var thumbs = [];
  for (var l = 0; l < L; l++) {
    grid.appendChild(el("span", null, d.layers[l]));
    thumbs.push([]);
    for (var h = 0; h < H; h++) {
      var t = el("canvas", "mhsa-thumb");
      t.title = d.layers[l] + d.heads[h];
      t.setAttribute("data-head", d.layers[l] + d.heads[h]);
      paint(t, l, h);
      t.addEventListener("click", select.bind(null, l, h));
      grid.appendChild(t); thumbs[l].push(t);
    }
  }
  var detail = el("div", "mhsa-detail"), heading = el("div", "mhsa-heading");
  var big = el("canvas", "mhsa-big"), svgNS = "http://www.w3.org/2000/svg";
  var svg = document.createElementNS(svgNS, "svg");
  var readout = el("div", "mhsa-readout"), strips = el("div", "mhsa-tokens");
  detail.appendChild(heading); detail.appendChild(big); detail.appendChild(svg);
  detail.appendChild(readout); detail.appendChild(strips);
  main.appendChild(grid); main.appendChild(detail); root.appendChild(main);

  var square = M === N && d.queries.every(function (t, i) { return t === d.keys[i]; });
  function strip(label, tokens, cls) {
    var box = el("div");
    if (!square) box.appendChild(el("span", "mhsa-label", label + ": "));
    var spans = tokens.map(function (tok, i) {
      var s = el("span", "mhsa-tok " + cls, tok); s.setAttribute("data-i", i); box.appendChild(s); return s;
    });
    strips.appendChild(box); return spans;
  }
  var qSpans = strip("queries", d.queries, "mhsa-q");
  var kSpans = square ? qSpans : strip("keys", d.keys, "mhsa-k");
  qSpans.forEach(function (s, i) {
    s.addEventListener("mouseenter", function () { attendFrom(i); });
    s.addEventListener("mouseleave", function () { attendFrom(-1); });
  });

  function attendFrom(q) {
    state.from = q;
    qSpans.forEach(function (s, i) { s.classList.toggle("mhsa-from", i === q); });
    kSpans.forEach(function (s, k) {
      var v = q < 0 ? 0 : w(state.l, state.h, q, k);
      var c = rgb(v);
      s.style.backgroundColor = q < 0 ? "" : "rgb(" + c.join(",") + ")";
      s.style.color = q < 0 ? "" : (v > 0.5 ? (dark ? "#18181b" : "#ffffff") : "");
      s.title = q < 0 ? "" : d.queries[q] + " → " + d.keys[k] + ": " + v.toFixed(3);
    });
    if (q >= 0) {
      var best = 0;
      for (var k = 1; k < N; k++) if (w(state.l, state.h, q, k) > w(state.l, state.h, q, best)) best = k;
      readout.textContent = d.queries[q] + " attends most to " + d.keys[best] + " (#" + best + "): " +
        w(state.l, state.h, q, best).toFixed(3);
    } else {
      readout.textContent = "";
    }
    if (state.view === "line") {
      svg.querySelectorAll("line").forEach(function (ln) {
        ln.style.display = q < 0 || +ln.getAttribute("data-q") === q ? "" : "none";
      });
    }
  }
  big.addEventListener("mousemove", function (e) {
    var r = big.getBoundingClientRect();
    var k = Math.min(N - 1, Math.floor((e.clientX - r.left) / r.width * N));
    var q = Math.min(M - 1, Math.floor((e.clientY - r.top) / r.height * M));
    if (q < 0 || k < 0) return;
    readout.textContent = d.queries[q] + " (#" + q + ") → " + d.keys[k] + " (#" + k + "): " +
      w(state.l, state.h, q, k).toFixed(3);
  });

  function lines() {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var row = 18, width = 360, rows = Math.max(M, N);
    svg.setAttribute("width", width); svg.setAttribute("height", rows * row + 4);
    var stroke = "rgb(" + hi.join(",") + ")";
    function text(x, y, s, anchor, i) {
      var t = document.createElementNS(svgNS, "text");
      t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor);
      t.textContent = s;
      if (i !== undefined) {
        t.setAttribute("data-i", i); t.style.cursor = "default";
        t.addEventListener("mouseenter", function () { attendFrom(i); });
        t.addEventListener("mouseleave", function () { attendFrom(-1); });
      }
      svg.appendChild(t);
    }
    for (var q = 0; q < M; q++) {
      for (var k = 0; k < N; k++) {
        var v = w(state.l, state.h, q, k);
        if (v < 0.01) continue;
        var ln = document.createElementNS(svgNS, "line");
        ln.setAttribute("x1", 120); ln.setAttribute("y1", q * row + 13);
        ln.setAttribute("x2", width - 120); ln.setAttribute("y2", k * row + 13);
        ln.setAttribute("stroke", stroke); ln.setAttribute("stroke-opacity", v);
        ln.setAttribute("stroke-width", 2); ln.setAttribute("data-q", q);
        svg.appendChild(ln);
      }
    }
    d.queries.forEach(function (s, i) { text(114, i * row + 17, s, "end", i); });
    d.keys.forEach(function (s, k) { text(width - 114, k * row + 17, s, "start"); });
  }

  function draw() {
    heading.textContent = d.layers[state.l] + d.heads[state.h];
    big.style.display = state.view === "heads" ? "" : "none";
    svg.style.display = state.view === "line" ? "" : "none";
    if (state.view === "heads") paint(big, state.l, state.h); else lines();
    attendFrom(state.from);
  }
  function select(l, h) {
    thumbs[state.l][state.h].classList.remove("mhsa-on");
    state.l = l; state.h = h;
    thumbs[l][h].classList.add("mhsa-on");
    layerSel.value = l; headSel.value = h;
    draw();
  }
  select(state.l, state.h);
})();
