// The console: a models page and a page per model, routed by the URL's hash
// (#/ and #/models/<name>), in plain ES modules without a build step.
import { api, ApiError, getKey, setKey, subscribe } from "./api.js";
import { PALETTE, ProgressChart, RocChart, ScatterChart } from "./charts.js";

const main = document.getElementById("main");
const keybox = document.getElementById("keybox");

/** What the viewer's key may do: {keys_configured, scopes} (null: unknown yet). */
let access = null;
/** Stops the current page's timers and sockets when the page changes. */
let leave = () => {};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function can(scope) {
  return access !== null && access.scopes.includes(scope);
}

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(digits);
  return String(value);
}

function problemText(error) {
  if (error instanceof ApiError) {
    const p = error.problem;
    const first = p.errors && p.errors[0] ? ` (${(p.errors[0].loc || []).join(".")}: ${p.errors[0].msg})` : "";
    return `${error.status} ${p.title || ""}: ${p.detail || ""}${first}`;
  }
  return String(error);
}

// -- the key ---------------------------------------------------------------------------------

async function loadAccess() {
  try {
    access = await api("GET", "/v1/key");
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    if (error.status === 401) access = null;
    else if (error.status === 403) access = { keys_configured: true, scopes: ["(no query scope)"] };
    else throw error;
  }
  renderKeybox();
  return access;
}

function renderKeybox() {
  keybox.replaceChildren();
  if (access === null) {
    keybox.append("API key required");
    return;
  }
  if (!access.keys_configured) {
    keybox.append(el("span", { id: "scopes", "data-scopes": access.scopes.join(" ") }, "No API keys configured: every action is open"));
    return;
  }
  keybox.append(
    el("span", { id: "scopes", "data-scopes": access.scopes.join(" ") }, `Key scopes: ${access.scopes.join(", ")}`),
    " ",
    el("button", { type: "button", onclick: () => { setKey(null); route(); } }, "Forget key"),
  );
}

function keyForm(message) {
  const input = el("input", { type: "password", id: "key", autocomplete: "off", size: 40, required: true });
  const form = el(
    "form",
    { id: "key-form", class: "card" },
    el("h2", {}, "API key"),
    el("p", {}, message),
    el("p", { class: "muted" }, "The key is kept for this tab only (sessionStorage) and sent as 'Authorization: Bearer'."),
    el("label", {}, "Key ", input),
    " ",
    el("button", { type: "submit" }, "Use key"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setKey(input.value.trim());
    route();
  });
  main.replaceChildren(form);
  input.focus();
}

// -- the models page -------------------------------------------------------------------------

const COLUMNS = [
  ["name", "Name"], ["algorithm", "Algorithm"], ["dim", "Dim"], ["version", "Version"],
  ["samples_seen", "Samples"], ["classes", "Classes"], ["calibrated", "Calibrated"],
  ["owner", "Owner here"], ["lag", "Lag"],
];

function modelsPage() {
  let timer = null;
  let stopped = false;
  const status = el("p", { id: "models-status", class: "muted" });
  const body = el("tbody");
  const table = el(
    "table",
    { id: "models" },
    el("thead", {}, el("tr", {}, COLUMNS.map(([, title]) => el("th", {}, title)), el("th", {}, ""))),
    body,
  );
  const admin = can("admin");
  const nameInput = el("input", { name: "name", required: true, pattern: "[a-z0-9][a-z0-9_-]{0,63}", placeholder: "faces" });
  const dimInput = el("input", { name: "dim", type: "number", min: 1, required: true, value: 16 });
  const algo = el("select", { name: "algorithm" },
    ["copml", "opml", "sgd", "sgd_psd", "brm", "lda"].map((a) => el("option", { value: a }, a)));
  const holdout = el("input", { name: "holdout", type: "number", min: 0, max: 0.5, step: 0.01, value: 0 });
  const createStatus = el("span", { id: "create-status", class: "muted" });
  const create = el(
    "form",
    { id: "create", class: "card" },
    el("h2", {}, "Create a model"),
    admin ? null : el("p", { class: "muted" }, "Creating and deleting models needs a key with the admin scope."),
    el("fieldset", { disabled: !admin },
      el("label", {}, "Name ", nameInput), " ",
      el("label", {}, "Dim ", dimInput), " ",
      el("label", {}, "Algorithm ", algo), " ",
      el("label", {}, "Held out ", holdout), " ",
      el("button", { type: "submit" }, "Create")),
    " ",
    createStatus,
  );
  create.addEventListener("submit", async (event) => {
    event.preventDefault();
    const spec = { name: nameInput.value.trim(), dim: Number(dimInput.value), algorithm: algo.value };
    if (Number(holdout.value) > 0) spec.holdout = Number(holdout.value);
    try {
      await api("POST", "/v1/models", spec);
      createStatus.textContent = `created ${spec.name}`;
      refresh();
    } catch (error) {
      createStatus.textContent = problemText(error);
    }
  });

  async function remove(name) {
    if (!confirm(`Delete model ${name} and all its data?`)) return;
    try {
      await api("DELETE", `/v1/models/${encodeURIComponent(name)}`);
      status.textContent = `deleted ${name}`;
    } catch (error) {
      status.textContent = problemText(error);
    }
    refresh();
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const { models } = await api("GET", "/v1/models");
      if (stopped) return;
      body.replaceChildren(
        ...models.map((m) => {
          const row = { ...m, calibrated: m.verification.calibrated ? "yes" : "no",
            owner: m.owner ? "yes" : "no", lag: Math.max(0, (m.logged_seq || 0) - m.version) };
          return el("tr", { "data-model": m.name },
            COLUMNS.map(([k]) => el("td", {}, k === "name"
              ? el("a", { href: `#/models/${encodeURIComponent(m.name)}` }, m.name) : fmt(row[k]))),
            el("td", {}, el("button", {
              type: "button", class: "delete", disabled: !admin,
              title: admin ? "Delete this model" : "needs the admin scope",
              onclick: () => remove(m.name),
            }, "Delete")));
        }),
      );
      status.textContent = `${models.length} model(s); refreshed ${new Date().toLocaleTimeString()}`;
      table.dataset.count = String(models.length);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return route();
      status.textContent = problemText(error);
    }
    // One list request every few seconds keeps the table live for any number of models (a
    // socket per model would not scale to hundreds of rows).
    if (!stopped) timer = setTimeout(refresh, 3000);
  }

  main.replaceChildren(el("h1", {}, "Models"), table, status, create);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// -- a model's page --------------------------------------------------------------------------

/** Runs `task` at most once per `ms`, never two at a time, the last request always served:
 * the heavier reads follow the /events frames without a polling loop of their own. */
function throttled(task, ms) {
  let running = false;
  let again = false;
  let last = 0;
  let timer = null;
  const run = async () => {
    timer = null;
    running = true;
    last = Date.now();
    try {
      await task();
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  };
  const schedule = () => {
    if (running) {
      again = true;
      return;
    }
    if (timer === null) timer = setTimeout(run, Math.max(0, last + ms - Date.now()));
  };
  schedule.cancel = () => clearTimeout(timer);
  return schedule;
}

function modelPage(name) {
  const path = `/v1/models/${encodeURIComponent(name)}`;
  const colours = new Map();
  const colourOf = (c) => {
    if (!colours.has(c)) colours.set(c, PALETTE[colours.size % PALETTE.length]);
    return colours.get(c);
  };
  let model = null;
  let recent = null;
  let certificate = null;
  let picked = 0;
  let frames = 0;

  const head = el("h1", {}, name);
  const summary = el("p", { class: "muted", id: "summary" });
  const counters = el("dl", { id: "counters", class: "counters" });
  const progressEl = el("div", { id: "progress", class: "chart" });
  const rocEl = el("div", { id: "roc", class: "chart" });
  const rocNote = el("p", { class: "muted", id: "roc-note" });
  const pictureX = el("div", { id: "picture-x", class: "chart" });
  const pictureZ = el("div", { id: "picture-z", class: "chart" });
  const pictureNote = el("p", { class: "muted", id: "picture-note" });
  const certBox = el("div", { id: "certificate" });

  const a = el("textarea", { id: "verify-a", rows: 2, cols: 50, placeholder: "[0.1, 0.2, …] or click a point" });
  const b = el("textarea", { id: "verify-b", rows: 2, cols: 50, placeholder: "[0.1, 0.2, …] or click a point" });
  const threshold = el("input", { id: "verify-threshold", type: "number", step: "any", min: 0, placeholder: "served" });
  const verifyOut = el("div", { id: "verify-result" });
  const verifyForm = el("form", { id: "verify", class: "card" },
    el("h2", {}, "Verify"),
    el("p", { class: "muted" }, "Click two points of either picture, or paste two vectors."),
    el("label", {}, "a ", a), el("br"), el("label", {}, "b ", b), el("br"),
    el("label", {}, "threshold (squared units; empty: the model's) ", threshold), " ",
    el("button", { type: "submit", id: "verify-go" }, "Verify"),
    verifyOut);
  verifyForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const body = { a: JSON.parse(a.value), b: JSON.parse(b.value) };
      if (threshold.value !== "") body.threshold = Number(threshold.value);
      const r = await api("POST", `${path}/verify`, body);
      verifyOut.replaceChildren(el("dl", { class: "counters", "data-answer": JSON.stringify(r) },
        el("dt", {}, "decision"), el("dd", { id: "verify-same" }, r.same ? "same class" : "different classes"),
        el("dt", {}, "squared distance"), el("dd", { id: "verify-d2" }, fmt(r.squared_distance, 6)),
        el("dt", {}, "distance"), el("dd", {}, fmt(Math.sqrt(r.squared_distance), 6)),
        el("dt", {}, "threshold"), el("dd", {}, fmt(r.threshold, 6)),
        el("dt", {}, "threshold source"), el("dd", { id: "verify-source" }, r.threshold_source || (r.calibrated ? "calibrated" : "fallback")),
        el("dt", {}, "version"), el("dd", {}, fmt(r.version))));
    } catch (error) {
      verifyOut.replaceChildren(el("p", { class: "error" }, error instanceof SyntaxError ? `not a JSON array: ${error.message}` : problemText(error)));
    }
  });

  const identifyBox = el("div", { id: "identify" });

  const pick = (i) => {
    if (!recent) return;
    const target = picked % 2 === 0 ? a : b;
    target.value = JSON.stringify(recent.samples[i].x);
    target.dataset.label = recent.samples[i].y;
    picked += 1;
  };

  main.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← Models")),
    head, summary, counters,
    el("section", { class: "grid" },
      el("div", {}, progressEl),
      el("div", {}, rocEl, rocNote)),
    el("h2", {}, "Recent samples, first two principal components"),
    pictureNote,
    el("section", { class: "grid" }, el("div", {}, pictureX), el("div", {}, pictureZ)),
    el("section", { class: "grid" }, verifyForm, identifyBox),
    certBox,
  );
  const progress = new ProgressChart(progressEl);
  const roc = new RocChart(rocEl);
  const scatterX = new ScatterChart(pictureX, "as given: x", pick);
  const scatterZ = new ScatterChart(pictureZ, "as the metric sees them: L x", pick);

  function showCounters(frame) {
    const v = frame.verification || {};
    const u = frame.updates || {};
    const items = [
      ["version", frame.version], ["samples", frame.samples_seen], ["classes", frame.classes],
      ["triplet updates", u.triplet], ["pair updates", u.pair], ["passive", u.passive],
      ["held out", u.held_out], ["threshold", v.threshold], ["calibrated", v.calibrated ? "yes" : "no"],
      ["EER", v.eer], ["triplet accuracy", v.accuracy], ["frames", frames], ["dropped", frame.dropped || 0],
    ];
    counters.replaceChildren(...items.flatMap(([k, val]) => [el("dt", {}, k), el("dd", { "data-counter": k }, fmt(val))]));
    counters.dataset.version = String(frame.version);
  }

  const loadCurve = throttled(async () => {
    try {
      const curve = await api("GET", `${path}/calibration?points=50`);
      roc.update(curve, certificate);
      rocEl.dataset.version = String(curve.version);
      rocNote.textContent = curve.points.length
        ? `${curve.pairs} pairs in the window; served threshold ${fmt(curve.threshold)} (${curve.threshold_source}): FAR ${fmt(curve.at_threshold.far)}, FRR ${fmt(curve.at_threshold.frr)}`
        : "No pairs yet: the curve appears once classes have a second sample.";
    } catch (error) {
      rocNote.textContent = problemText(error);
    }
  }, 1000);

  const loadRecent = throttled(async () => {
    try {
      recent = await api("GET", `${path}/recent?limit=300`);
      const labels = recent.samples.map((s) => s.y);
      // a stable series order: the charts are rebuilt only when the set of classes changes
      const classes = [...recent.classes].sort();
      scatterX.update(recent.projection.x.points, labels, classes, colourOf);
      scatterZ.update(recent.projection.z.points, labels, classes, colourOf);
      pictureX.dataset.version = String(recent.version);
      pictureZ.dataset.version = String(recent.version);
      const share = (p) => p.explained.map((s) => `${(100 * s).toFixed(0)}%`).join(" + ");
      pictureNote.textContent = `${recent.count} latest samples of version ${recent.version}, ${recent.classes.length} classes; variance shown: x ${share(recent.projection.x)}, L x ${share(recent.projection.z)}.`;
    } catch (error) {
      pictureNote.textContent = problemText(error);
    }
  }, 1000);

  const loadCertificate = throttled(async () => {
    if (!model || !(model.holdout > 0)) {
      certBox.replaceChildren();
      return;
    }
    try {
      certificate = await api("GET", `${path}/certificate`);
      const row = (k) => {
        const r = certificate[k];
        return el("tr", {}, el("td", {}, k.replace("_", " ")), el("td", {}, fmt(r.m)), el("td", {}, fmt(r.errors)),
          el("td", {}, fmt(r.empirical)), el("td", {}, fmt(r.bound)));
      };
      certBox.replaceChildren(el("div", { class: "card" },
        el("h2", {}, "Latest certificate"),
        el("p", { class: "muted" }, `version ${certificate.version}, ${certificate.method}, delta ${certificate.delta}, threshold ${fmt(certificate.threshold)} (${certificate.threshold_source})`),
        el("table", {}, el("thead", {}, el("tr", {}, ["", "m", "errors", "estimate", "bound"].map((h) => el("th", {}, h)))),
          el("tbody", {}, ["triplet_error", "false_accept", "false_reject"].map(row)))));
    } catch (error) {
      certificate = null;
      certBox.replaceChildren(el("div", { class: "card" }, el("h2", {}, "Certificate"),
        el("p", { class: "muted" }, problemText(error))));
    }
    loadCurve();
  }, 5000);

  async function loadIdentify() {
    let gallery;
    try {
      gallery = await api("GET", `${path}/gallery?limit=1`);
    } catch {
      return;
    }
    if (!gallery.count) {
      identifyBox.replaceChildren();
      return;
    }
    const x = el("textarea", { id: "identify-x", rows: 2, cols: 50, placeholder: "[…] or the verify box a" });
    const k = el("input", { id: "identify-k", type: "number", min: 1, value: 5 });
    const out = el("div", { id: "identify-result" });
    const form = el("form", { class: "card" }, el("h2", {}, "Identify by example"),
      el("p", { class: "muted" }, `The gallery holds ${gallery.count} item(s).`),
      el("label", {}, "probe ", x), el("br"), el("label", {}, "k ", k), " ",
      el("button", { type: "submit" }, "Identify"), out);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        const r = await api("POST", `${path}/identify`, { x: JSON.parse(x.value || a.value), k: Number(k.value) });
        out.replaceChildren(r.unknown ? el("p", {}, "no gallery item passes the threshold") : "",
          el("table", {}, el("thead", {}, el("tr", {}, ["id", "class", "squared distance", "same"].map((h) => el("th", {}, h)))),
            el("tbody", {}, r.matches.map((m) => el("tr", {}, el("td", {}, m.id), el("td", {}, fmt(m.y)),
              el("td", {}, fmt(m.squared_distance, 6)), el("td", {}, m.same ? "yes" : "no"))))));
      } catch (error) {
        out.replaceChildren(el("p", { class: "error" }, problemText(error)));
      }
    });
    identifyBox.replaceChildren(form);
  }

  (async () => {
    try {
      model = await api("GET", path);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return route();
      main.replaceChildren(el("p", { class: "error" }, problemText(error)), el("a", { href: "#/" }, "← Models"));
      return;
    }
    summary.textContent = `${model.algorithm}, dim ${model.dim}, normalize ${model.normalize}, margin ${fmt(model.margin)}` +
      (model.holdout ? `, ${model.holdout} held out` : "");
    loadCertificate();
    loadIdentify();
  })();

  const stop = subscribe(
    name,
    500,
    (frame) => {
      frames += 1;
      showCounters(frame);
      progress.add(frame);
      progressEl.dataset.frames = String(frames);
      loadCurve();
      loadRecent();
      loadCertificate();
    },
    () => main.prepend(el("p", { class: "error", id: "gone" }, `Model ${name} was deleted.`)),
  );
  return () => {
    stop();
    loadCurve.cancel();
    loadRecent.cancel();
    loadCertificate.cancel();
  };
}

// -- routing ---------------------------------------------------------------------------------

async function route() {
  leave();
  leave = () => {};
  try {
    await loadAccess();
  } catch (error) {
    main.replaceChildren(el("p", { class: "error" }, `The service did not answer: ${problemText(error)}`));
    return;
  }
  if (access === null) {
    keyForm(getKey() ? "That key was not accepted. Enter another." : "This service requires an API key.");
    return;
  }
  const match = location.hash.match(/^#\/models\/([^/]+)$/);
  leave = match ? modelPage(decodeURIComponent(match[1])) : modelsPage();
}

window.addEventListener("hashchange", route);
route();
