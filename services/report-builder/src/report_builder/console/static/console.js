// gpumedic console: live parts without reloading. /live says when something changed (server-sent
// events); then the page is fetched again and every element marked data-live is swapped for its
// new copy, so forms and scrolling stay as they are. No framework, nothing from elsewhere.
(function () {
  "use strict";
  const state = document.getElementById("live-state");
  let busy = false;
  let again = false;

  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" });
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      document.querySelectorAll("[data-live][id]").forEach(function (old) {
        const replacement = fresh.getElementById(old.id);
        if (replacement && replacement.innerHTML !== old.innerHTML) { old.replaceWith(document.importNode(replacement, true)); }
      });
      document.body.dataset.refreshed = String(Date.now());
      if (state) { state.textContent = "live"; state.title = "updated " + new Date().toLocaleTimeString(); }
    } catch (error) {
      if (state) { state.textContent = "live (retrying)"; state.title = String(error); }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  if (!document.querySelector("[data-live]")) { return; }
  if (window.EventSource) {
    const source = new EventSource("/live");
    source.addEventListener("change", refresh);
    source.onerror = function () { if (state) { state.textContent = "live (reconnecting)"; } };
    source.onopen = function () { if (state) { state.textContent = "live"; } };
  } else {
    window.setInterval(refresh, 5000);  // no server-sent events: poll
  }
})();
