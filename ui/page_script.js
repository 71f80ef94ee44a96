// The app's one script in the page (ui/page.py, PAGE_SCRIPT; constant text, no user input).
// It runs when a page's first element arrives; each part takes effect once per tab (the
// setter is defined once; a second import of the same URL is the module already loaded).
// Measured in BENCHMARKS.md §4. Both parts lean on the internals of the plotly.js and
// Streamlit versions installed: the script reports what it found in `window.__mhsaPageScript`,
// and tests/browser/test_page_script.py fails, saying what broke, when an upgrade changes them.
(() => {
  const status = (window.__mhsaPageScript ??= {
    // "hidden": ours is installed; "taken": something else defined `_inputArray` first
    cache: null,
    hidden: 0, // plotly.js's decoded arrays kept out of JSON so far in this tab
    other: 0, // writes of `_inputArray` to anything else, left as plain properties
    chunk: null, // "not found", "loading", "loaded" or "failed: " and the reason
  });

  // 1. Keep plotly.js's decoded arrays out of the JSON Streamlit's chart element makes of a
  // figure. plotly.js decodes each binary array of a figure (numpy arrays travel base64) and
  // caches the result on the array's spec, `{dtype, bdata, shape}`, as `_inputArray`;
  // Streamlit's chart element serialises the figure a second time after the first drawing
  // (JSON, colour replaces, parse), so a large head's decoded floats, several times the
  // base64 sent, went through that JSON too (BENCHMARKS.md §4). Made non-enumerable on those
  // specs only, the cache still works for plotly.js (it reads plain `x._inputArray`) and JSON
  // leaves it out; any other object gets the plain property an assignment would have made.
  const owned = Object.getOwnPropertyDescriptor(Object.prototype, "_inputArray");
  if (!owned) {
    Object.defineProperty(Object.prototype, "_inputArray", {
      configurable: true,
      get() {
        return undefined;
      },
      set(value) {
        const spec = Object.hasOwn(this, "bdata") && Object.hasOwn(this, "dtype");
        Object.defineProperty(this, "_inputArray", {
          value,
          writable: true,
          configurable: true,
          enumerable: !spec,
        });
        if (spec) status.hidden += 1;
        else status.other += 1;
      },
    });
    status.cache = "hidden";
  } else if (status.cache === null) {
    status.cache = "taken";
  }

  // 2. Load Streamlit's plotly chunk (large, and long to evaluate: BENCHMARKS.md §4) now,
  // while the server computes the page, instead of when the page's first figure arrives.
  // The same URL as Streamlit's own lazy import, so the browser evaluates it once.
  const chunk = PLOTLY_CHUNK;
  const index = document.querySelector('script[type="module"][src*="/static/js/index."]');
  if (!chunk || !index) {
    status.chunk ??= "not found";
  } else if (status.chunk === null || status.chunk === "not found") {
    status.chunk = "loading";
    import(new URL(chunk, index.src).href).then(
      () => {
        status.chunk = "loaded";
      },
      (e) => {
        status.chunk = `failed: ${e}`;
      },
    );
  }

  // 3. A skip link (WCAG 2.4.1): the first stop of Tab, shown when focused; Enter moves the
  // focus to the page's main content, past the sidebar's page links and settings.
  if (!document.getElementById("mhsa-skip")) {
    const skip = document.createElement("a");
    skip.id = "mhsa-skip";
    skip.href = "#";
    skip.textContent = "Skip to main content";
    skip.addEventListener("click", (event) => {
      event.preventDefault();
      const main = document.querySelector('[data-testid="stMain"]');
      if (!main) return;
      main.setAttribute("tabindex", "-1");
      main.focus();
    });
    document.body.prepend(skip);
  }

  // 4. Boxes that scroll (a table in presentation mode: ui/page.py, table) take the focus, so
  // that the keyboard scrolls them too (WCAG 2.1.1; axe-core's scrollable-region-focusable):
  // marked as each arrives, once per tab however many pages follow.
  if (!status.scrollers) {
    status.scrollers = true;
    const boxes = '[data-testid="stVerticalBlock"][overflow="auto"], [data-testid="stTable"] > div';
    let queued = false;
    const mark = () => {
      queued = false;
      for (const box of document.querySelectorAll(boxes)) {
        if (box.hasAttribute("tabindex")) continue;
        box.tabIndex = 0;
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", "Table (scrolls)");
      }
    };
    new MutationObserver(() => {
      if (!queued) {
        queued = true;
        requestAnimationFrame(mark);
      }
    }).observe(document.body, { childList: true, subtree: true });
    mark();
  }
})();
