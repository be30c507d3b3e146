// llmem ui: the only script (the CSP allows no inline one). Pages work without it; it adds
// live refresh and submit-on-change, both declared in the markup with data- attributes.
"use strict";

// <section id="x" data-live="5">: every 5 s, fetch this page again and swap in the new #x.
function liveRefresh(element) {
  const seconds = Number(element.dataset.live) || 5;
  setInterval(async () => {
    if (document.hidden) return;
    try {
      const reply = await fetch(window.location.href, { credentials: "same-origin" });
      if (!reply.ok) return;
      const page = new DOMParser().parseFromString(await reply.text(), "text/html");
      const fresh = page.getElementById(element.id);
      if (fresh && fresh.innerHTML !== element.innerHTML) {
        element.replaceChildren(...fresh.childNodes);
      }
    } catch (_) { /* the server stopped: the page stays as it is */ }
  }, seconds * 1000);
}

// <select data-submit-on-change>: a filter applies as soon as it is picked.
function submitOnChange(control) {
  control.addEventListener("change", () => control.form && control.form.requestSubmit());
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live][id]").forEach(liveRefresh);
  document.querySelectorAll("[data-submit-on-change]").forEach(submitOnChange);
});
