// Live refresh of the job admin's pages (dashboard, workers, job list).
//
// Every element with data-live-region (and an id) is fetched again every
// data-live-every seconds (default 5) from the same URL and replaced in place:
// no full reload, the scroll position kept. It pauses while the tab is hidden,
// while the operator has rows selected or a field focused (a refresh must not
// undo a selection about to be acted on), and by the Pause button. Plain
// JavaScript, no library: the page works the same without it.
(function () {
  "use strict";
  const regions = Array.from(document.querySelectorAll("[data-live-region][id]"));
  if (!regions.length || !window.fetch || !window.DOMParser) {
    return;
  }
  const every = 1000 * Math.max(1, parseFloat(regions[0].dataset.liveEvery || "5"));
  const key = "jobs-live-paused";
  let paused = window.localStorage && localStorage.getItem(key) === "1";
  let timer = null;

  const bar = document.createElement("p");
  bar.className = "jobs-live";
  bar.setAttribute("aria-live", "polite");
  const state = document.createElement("span");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "button jobs-live-toggle";
  bar.append(state, " ", button);
  regions[0].before(bar);

  function stamp() {
    return new Date().toTimeString().slice(0, 8);
  }

  function show(text) {
    state.textContent = text;
    button.textContent = paused ? "Resume live updates" : "Pause live updates";
  }

  function busy() {
    // Selected rows, or a field being used: the operator is about to act.
    if (document.querySelector("#result_list input.action-select:checked")) {
      return true;
    }
    // (A checkbox keeps the focus after it is unticked: only fields being typed in
    // or chosen from count.)
    const active = document.activeElement;
    const typing = "select, textarea, input:not([type=checkbox]):not([type=radio]):not([type=submit])";
    return Boolean(active && active.closest("[data-live-region]") && active.matches(typing));
  }

  async function refresh() {
    timer = null;
    if (paused) {
      return;
    }
    if (document.hidden || busy()) {
      schedule();
      return;
    }
    try {
      const answer = await fetch(window.location.href, {
        headers: { "X-Requested-With": "jobs-live" },
        credentials: "same-origin",
      });
      if (!answer.ok) {
        throw new Error("HTTP " + answer.status);
      }
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      if (!busy()) {
        for (const region of regions) {
          const fresh = page.getElementById(region.id);
          if (fresh) {
            region.innerHTML = fresh.innerHTML;
          }
        }
      }
      show("Live: updated at " + stamp() + ", every " + every / 1000 + " s.");
    } catch (error) {
      show("Live: the last update failed (" + error.message + ") at " + stamp() + "; trying again.");
    }
    schedule();
  }

  function schedule() {
    if (!paused && timer === null) {
      timer = window.setTimeout(refresh, every);
    }
  }

  button.addEventListener("click", function () {
    paused = !paused;
    if (window.localStorage) {
      localStorage.setItem(key, paused ? "1" : "0");
    }
    show(paused ? "Live updates paused." : "Live: on, every " + every / 1000 + " s.");
    if (paused && timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
    schedule();
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      schedule();
    }
  });
  show(paused ? "Live updates paused." : "Live: on, every " + every / 1000 + " s.");
  schedule();
})();
