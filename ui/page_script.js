// The app's one script in the page (ui/page.py, PAGE_SCRIPT; constant text, no user input).
// It runs when a page's first element arrives; each part takes effect once per tab (the
// setter is defined once; a second import of the same URL is the module already loaded).
// Measured in BENCHMARKS.md §4.
(() => {
  // 1. Keep plotly.js's decoded arrays out of the JSON Streamlit's chart element makes of a
  // figure. plotly.js decodes each binary array of a figure (numpy arrays travel base64) and
  // caches the result on the figure's own object as `_inputArray`; Streamlit's chart element
  // serialises that object a second time after the first drawing (JSON, 39 colour replaces,
  // parse), so a 512 x 512 head, 1.4 MB as sent, became 8.6 MB of JSON there. Made
  // non-enumerable, the cache still works for plotly.js (it reads plain `x._inputArray`) and
  // JSON leaves it out.
  if (!Object.getOwnPropertyDescriptor(Object.prototype, "_inputArray")) {
    Object.defineProperty(Object.prototype, "_inputArray", {
      configurable: true,
      get() {
        return undefined;
      },
      set(value) {
        Object.defineProperty(this, "_inputArray", {
          value,
          writable: true,
          configurable: true,
          enumerable: false,
        });
      },
    });
  }

  // 2. Load Streamlit's plotly chunk (4.7 MB, 0.7-1 s of the main thread to evaluate) now,
  // while the server computes the page, instead of when the page's first figure arrives.
  // The same URL as Streamlit's own lazy import, so the browser evaluates it once.
  const chunk = PLOTLY_CHUNK;
  const index = document.querySelector('script[type="module"][src*="/static/js/index."]');
  if (chunk && index) import(new URL(chunk, index.src).href).catch(() => {});
})();
