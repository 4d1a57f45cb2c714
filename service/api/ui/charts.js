// The console's charts: uPlot does all drawing; this module only shapes the data for it.
import uPlot from "./vendor/uplot/uPlot.esm.js";

/** Class colours (Tableau 10): a class keeps its colour on a page while it stays in view. */
export const PALETTE = [
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
];

function width(el) {
  return Math.max(280, Math.min(560, el.clientWidth || 480));
}

/** Records on the chart's element how many points each series has (the browser test and
 * anyone inspecting the page read them). */
function mark(el, data) {
  const counts = data.slice(1).map((ys) => ys.filter((v) => v !== null && v !== undefined).length);
  el.dataset.points = String(data[0].length);
  el.dataset.series = counts.join(",");
}

/** Learning progress: triplet accuracy and EER of the calibration window over samples seen. */
export class ProgressChart {
  constructor(el) {
    this.el = el;
    this.data = [[], [], []];
    this.plot = new uPlot(
      {
        title: "Calibration window over samples seen",
        width: width(el),
        height: 260,
        scales: { x: { time: false }, y: { range: [0, 1] } },
        axes: [{ label: "samples seen" }, { label: "rate" }],
        legend: { live: false },
        series: [
          { label: "samples" },
          { label: "triplet accuracy", stroke: "#59a14f", width: 2, points: { show: true, size: 7 } },
          { label: "EER", stroke: "#e15759", width: 2, points: { show: true, size: 7 } },
        ],
      },
      this.data,
      el,
    );
    mark(el, this.data);
  }

  /** One /events frame: a point when the version moved on and the window has pairs. */
  add(frame) {
    const v = frame.verification || {};
    const xs = this.data[0];
    if (v.accuracy === null || v.accuracy === undefined) return;
    if (xs.length && xs[xs.length - 1] >= frame.samples_seen) return;
    xs.push(frame.samples_seen);
    this.data[1].push(v.accuracy);
    this.data[2].push(v.eer);
    this.plot.setData(this.data);
    mark(this.el, this.data);
    this.el.dataset.last = String(frame.samples_seen);
  }
}

/** Series on one shared x: uPlot wants x ascending; each series is null where it has no point. */
function merge(parts) {
  const rows = [];
  parts.forEach((points, s) => points.forEach(([x, y]) => rows.push([x, s, y])));
  rows.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const data = [rows.map((r) => r[0])];
  parts.forEach((_, s) => data.push(rows.map((r) => (r[1] === s ? r[2] : null))));
  return data;
}

/** The verification curve (ROC: true accept rate against false accept rate) of the
 * calibration window, the served threshold on it, and held-out estimates and bounds. */
export class RocChart {
  constructor(el) {
    this.el = el;
    const point = (stroke, size) => ({ show: true, size, stroke, fill: stroke });
    this.plot = new uPlot(
      {
        title: "ROC of the calibration window",
        width: width(el),
        height: 300,
        scales: { x: { time: false, range: [0, 1] }, y: { range: [0, 1] } },
        axes: [{ label: "false accept rate" }, { label: "true accept rate (1 - FRR)" }],
        legend: { live: false },
        series: [
          { label: "FAR" },
          { label: "ROC", stroke: "#4e79a7", width: 2, spanGaps: true, points: { show: false } },
          { label: "served threshold", stroke: "#e15759", paths: () => null, points: point("#e15759", 10) },
          { label: "held-out estimate", stroke: "#59a14f", paths: () => null, points: point("#59a14f", 9) },
          { label: "held-out bound", stroke: "#b07aa1", paths: () => null, points: point("#b07aa1", 9) },
        ],
      },
      [[], [], [], [], []],
      el,
    );
    mark(el, [[], [], [], [], []]);
  }

  update(curve, certificate) {
    const roc = curve.points.map((p) => [p.far, 1 - p.frr]);
    const at = curve.at_threshold ? [[curve.at_threshold.far, 1 - curve.at_threshold.frr]] : [];
    const estimate = [];
    const bound = [];
    if (certificate) {
      const fa = certificate.false_accept;
      const fr = certificate.false_reject;
      estimate.push([fa.empirical, 1 - fr.empirical]);
      bound.push([fa.bound, 1 - fr.bound]);
    }
    const data = merge([roc, at, estimate, bound]);
    this.plot.setData(data);
    mark(this.el, data);
  }
}

/** A scatter of 2-D points coloured by class (uPlot points, no lines). `onPick(i)` gets the
 * index of the sample nearest a click. */
export class ScatterChart {
  constructor(el, title, onPick) {
    this.el = el;
    this.title = title;
    this.onPick = onPick;
    this.plot = null;
    this.classes = [];
    this.order = [];
  }

  update(points, labels, classes, colourOf) {
    const order = points.map((_, i) => i).sort((a, b) => points[a][0] - points[b][0] || a - b);
    const data = [order.map((i) => points[i][0])];
    for (const c of classes) data.push(order.map((i) => (labels[i] === c ? points[i][1] : null)));
    const same = this.plot && classes.join("\u0000") === this.classes.join("\u0000");
    if (!same) {
      if (this.plot) this.plot.destroy();
      this.classes = classes.slice();
      const series = [{ label: "PC 1" }];
      for (const c of classes) {
        const colour = colourOf(c);
        series.push({
          label: `class ${c}`,
          stroke: colour,
          paths: () => null,
          points: { show: true, size: 7, stroke: colour, fill: colour },
        });
      }
      this.plot = new uPlot(
        {
          title: this.title,
          width: width(this.el),
          height: 300,
          scales: { x: { time: false } },
          axes: [{ label: "PC 1" }, { label: "PC 2" }],
          cursor: { points: { show: false } },
          legend: { live: false },
          series,
        },
        data,
        this.el,
      );
      this.plot.over.addEventListener("click", (event) => this.pick(event));
      this.el.uplot = this.plot; // for whoever inspects the page (the browser tests do)
    } else {
      this.plot.setData(data);
    }
    this.order = order;
    this.points = points;
    this.el.dataset.classes = String(classes.length);
    this.el.dataset.colours = classes.map(colourOf).join(",");
    mark(this.el, data);
  }

  /** The sample nearest the click, in screen distance. */
  pick(event) {
    const u = this.plot;
    const rect = u.over.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    let best = -1;
    let bestDistance = Infinity;
    this.points.forEach(([x, y], i) => {
      const dx = u.valToPos(x, "x") - px;
      const dy = u.valToPos(y, "y") - py;
      const d = dx * dx + dy * dy;
      if (d < bestDistance) [best, bestDistance] = [i, d];
    });
    if (best >= 0 && bestDistance < 400) this.onPick(best);
  }
}
