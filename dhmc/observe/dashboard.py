# ruff: noqa: E501  (long lines only in the inline HTML/JS of PAGE)
"""Scheduler-side dhmc dashboard: JSON routes and a self-contained HTML page.

``DhmcSchedulerPlugin.start`` adds three tornado routes to the running
scheduler's HTTP application (``Scheduler.http_application``, the
``RoutingApplication`` that also serves ``/status`` and ``/metrics``):

* ``/dhmc/api/workers`` -- per-worker ``dhmc_*`` values from ``WorkerState.metrics``;
* ``/dhmc/api/progress`` -- latest driver-published progress per run;
* ``/dhmc/api/history`` -- 1 Hz chain-draws/s history and max R-hat per block;
* ``/dhmc`` -- an HTML page (inline JS, no CDN) polling them every second.

The driver publishes progress with :func:`publish_progress` as a scheduler
event on topic ``"dhmc-progress"``; the plugin's ``log_event`` hook keeps the
latest record per run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web
from tornado.ioloop import PeriodicCallback

from dhmc.observe.metrics import SCHEDULER_PLUGIN_NAME

logger = logging.getLogger(__name__)

PROGRESS_TOPIC = "dhmc-progress"
MAX_RUNS = 20
HISTORY_LEN = 300  # seconds of 1 Hz rate samples kept on the scheduler
MAX_WORKER_SERIES = 16
_ROUTES_FLAG = "_dhmc_routes"

_WORKER_FIELDS = (
    "chain_draws_per_s",
    "grad_evals_per_s",
    "blocks_done",
    "chain_draws",
    "grad_evals",
    "acceptance",
    "divergences",
    "compile_seconds",
    "sampling_seconds",
    "run_id",
    "phase",
)


def _clean(obj: Any) -> Any:
    """Plain JSON/msgpack-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (str, bool)) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    try:
        f = float(obj)
    except (TypeError, ValueError):
        return str(obj)
    if f.is_integer() and "int" in type(obj).__name__:
        return int(f)
    return f if math.isfinite(f) else None


def worker_records(scheduler: Any) -> list[dict[str, Any]]:
    """One record per connected worker, built from ``WorkerState.metrics``."""
    now = time.time()
    out = []
    for ws in sorted(scheduler.workers.values(), key=lambda w: w.address):
        m = ws.metrics
        rec: dict[str, Any] = {
            "worker": ws.address,
            "name": str(ws.name),
            "nthreads": ws.nthreads,
            "last_seen_s": round(now - ws.last_seen, 3),
        }
        for f in _WORKER_FIELDS:
            default = "" if f in ("run_id", "phase") else 0
            value = m.get("dhmc_" + f)
            rec[f] = default if value is None else value
        out.append(_clean(rec))
    return out


def _plugin(scheduler: Any) -> DhmcSchedulerPlugin:
    plugin = getattr(scheduler, "plugins", {}).get(SCHEDULER_PLUGIN_NAME)
    if isinstance(plugin, DhmcSchedulerPlugin):
        return plugin
    plugin = DhmcSchedulerPlugin()  # routes added without the plugin: rebuild from events
    for _, msg in scheduler.get_events(PROGRESS_TOPIC):
        plugin.log_event(PROGRESS_TOPIC, msg)
    return plugin


def progress_records(scheduler: Any) -> dict[str, dict[str, Any]]:
    """Latest progress record per ``run_id``."""
    return dict(_plugin(scheduler).runs)


def history_records(scheduler: Any) -> dict[str, Any]:
    """Rate history (1 Hz, scheduler-side) and max split R-hat per block, per run."""
    return _plugin(scheduler).history()


class _Handler(web.RequestHandler):
    def initialize(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def _json(self, obj: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(_clean(obj), allow_nan=False))


class WorkersHandler(_Handler):
    """``GET /dhmc/api/workers``."""

    def get(self) -> None:  # noqa: D102
        self._json(worker_records(self.scheduler))


class HistoryHandler(_Handler):
    """``GET /dhmc/api/history``."""

    def get(self) -> None:  # noqa: D102
        self._json(history_records(self.scheduler))


class ProgressHandler(_Handler):
    """``GET /dhmc/api/progress``."""

    def get(self) -> None:  # noqa: D102
        self._json(progress_records(self.scheduler))


class PageHandler(_Handler):
    """``GET /dhmc``: the HTML page, with the current data embedded."""

    def get(self) -> None:  # noqa: D102
        initial = {
            "workers": worker_records(self.scheduler),
            "progress": progress_records(self.scheduler),
            "history": history_records(self.scheduler),
            "scheduler": str(self.scheduler.address),
        }
        data = json.dumps(_clean(initial), allow_nan=False).replace("</", "<\\/")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE.replace("/*INITIAL*/null", data))


def _route_patterns(router: Any, seen: set[int] | None = None) -> set[str]:
    """All path patterns reachable from a tornado router."""
    seen = set() if seen is None else seen
    out: set[str] = set()
    if id(router) in seen:
        return out
    seen.add(id(router))
    for rule in getattr(router, "rules", []):
        regex = getattr(rule.matcher, "regex", None)
        if regex is not None:
            out.add(regex.pattern)
        if hasattr(rule.target, "rules"):
            out |= _route_patterns(rule.target, seen)
    return out


def _http_prefix(app: Any) -> str:
    # distributed prefixes all its routes (e.g. ".../health") with ``http_prefix``.
    for pat in _route_patterns(app.default_router):
        if pat.endswith("/health$"):
            return pat[: -len("health$")].rstrip("/")
    return ""


def add_routes(scheduler: Any) -> bool:
    """Add the dhmc routes to ``scheduler.http_application`` once.

    Returns
    -------
    bool
        True if routes were added, False if present already or no HTTP server.
    """
    app = getattr(scheduler, "http_application", None)
    if app is None or not hasattr(app, "add_handlers"):
        logger.warning("dhmc: scheduler has no HTTP application; dashboard routes not added")
        return False
    prefix = _http_prefix(app)
    api = prefix + "/dhmc/api/workers"
    if getattr(app, _ROUTES_FLAG, False) or any(api in p for p in _route_patterns(app.default_router)):
        return False
    kw = {"scheduler": scheduler}
    app.add_handlers(
        r".*$",
        [
            (api, WorkersHandler, kw),
            (prefix + "/dhmc/api/progress", ProgressHandler, kw),
            (prefix + "/dhmc/api/history", HistoryHandler, kw),
            (prefix + "/dhmc/?", PageHandler, kw),
        ],
    )
    setattr(app, _ROUTES_FLAG, True)
    return True


class DhmcSchedulerPlugin(SchedulerPlugin):
    """Serve the dhmc page and JSON routes; track progress and rate history."""

    name = SCHEDULER_PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.rhat: dict[str, list[list[float]]] = {}
        self.rates: deque[tuple[float, dict[str, float]]] = deque(maxlen=HISTORY_LEN)
        self._pc: PeriodicCallback | None = None

    def start(self, scheduler: Any) -> None:  # noqa: D102
        self.scheduler = scheduler
        for _, msg in scheduler.get_events(PROGRESS_TOPIC):
            self.log_event(PROGRESS_TOPIC, msg)
        add_routes(scheduler)
        self._pc = PeriodicCallback(self._sample, 1000)
        self._pc.start()

    async def close(self) -> None:  # noqa: D102
        if self._pc is not None:
            self._pc.stop()

    def _sample(self) -> None:
        rates = {}
        for ws in self.scheduler.workers.values():
            v = ws.metrics.get("dhmc_chain_draws_per_s")
            rates[ws.address] = float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0
        self.rates.append((time.time(), rates))

    def log_event(self, topic: str, msg: Any) -> None:  # noqa: D102
        if topic != PROGRESS_TOPIC or not isinstance(msg, dict):
            return
        run = str(msg.get("run_id", ""))
        old = self.runs.get(run)
        if old is None or (msg.get("published_at") or 0) >= (old.get("published_at") or 0):
            self.runs[run] = msg
        rhats = [c.get("rhat") for c in (msg.get("convergence") or {}).values() if isinstance(c, dict)]
        rhats = [r for r in rhats if isinstance(r, (int, float)) and math.isfinite(r)]
        if rhats and isinstance(msg.get("blocks_done"), (int, float)):
            by_block = {b: r for b, r in self.rhat.get(run, [])}
            by_block[msg["blocks_done"]] = max(rhats)
            self.rhat[run] = [[b, r] for b, r in sorted(by_block.items())][-500:]
        while len(self.runs) > MAX_RUNS:
            drop = min(self.runs, key=lambda r: self.runs[r].get("published_at") or 0)
            self.runs.pop(drop)
            self.rhat.pop(drop, None)

    def history(self) -> dict[str, Any]:
        """``{"t": [...], "total": [...], "workers": {addr: [...]}, "rhat": {run: [[block, max]]}}``."""
        samples = list(self.rates)
        latest = samples[-1][1] if samples else {}
        shown = sorted(latest, key=lambda a: -latest[a])[:MAX_WORKER_SERIES]
        return {
            "t": [t for t, _ in samples],
            "total": [sum(r.values()) for _, r in samples],
            "workers": {a: [r.get(a, 0.0) for _, r in samples] for a in sorted(shown)},
            "rhat": self.rhat,
        }


def publish_progress(client: Any, record: dict) -> None:
    """Send a run-progress record to the scheduler without waiting.

    Schedules ``scheduler.log_event("dhmc-progress", record)`` on the client's
    event loop and returns at once; failures are logged, never raised.

    Parameters
    ----------
    client : distributed.Client
    record : dict
        ``run_id``, ``phase``, ``blocks_done``, ``blocks_total``, ``chains``,
        ``draws_done``, ``draws_total``, ``elapsed_s`` and ``convergence``
        (``{param: {"rhat": float, "ess_bulk": float}}``).
    """
    try:
        msg = _clean(dict(record))
        msg.setdefault("published_at", time.time())

        async def _send() -> None:
            try:
                await client.scheduler.log_event(topic=PROGRESS_TOPIC, msg=msg)
            except Exception:
                logger.warning("dhmc: could not publish progress", exc_info=True)

        client.loop.add_callback(_send)
    except Exception:
        logger.warning("dhmc: could not publish progress", exc_info=True)


PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dhmc dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;background:#f4f6f9;color:#1d2733}
header{background:#1d3557;color:#fff;padding:12px 24px;display:flex;align-items:baseline;gap:16px}
header h1{margin:0;font-size:28px;letter-spacing:1px}header .sub{opacity:.8}header .upd{margin-left:auto;opacity:.8;font-size:12px}
main{padding:16px 24px;display:grid;grid-template-columns:1fr 1fr;gap:16px}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.12);padding:12px 16px}
.card h2{margin:0 0 8px;font-size:15px;color:#1d3557;text-transform:uppercase;letter-spacing:.5px}
.wide{grid-column:1/3}.tiles{display:flex;gap:12px;flex-wrap:wrap}
.tile{flex:1;min-width:140px;background:#eef3fa;border-radius:6px;padding:8px 12px}
.tile .v{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}.tile .k{font-size:12px;color:#5b6b7d}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e3e8ef}
th{font-size:12px;color:#5b6b7d;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{position:relative;background:#e3e8ef;border-radius:4px;height:18px;min-width:160px}
.bar>div{position:absolute;left:0;top:0;bottom:0;border-radius:4px}
.bar>span{position:relative;padding-left:6px;font-size:12px;line-height:18px;font-weight:600;font-variant-numeric:tabular-nums}
.b1>div{background:#7fb3e6}.b2>div{background:#f4b27a}.bp>div{background:#6cc08b}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#1d3557;color:#fff;font-size:12px}
.bad{color:#c0392b;font-weight:600}.ok{color:#1e8449}.muted{color:#8a97a6}
svg text{font-size:11px;fill:#5b6b7d}
</style></head><body>
<header><h1>dhmc</h1><span class="sub">ensemble HMC &middot; scheduler <span id="sched"></span></span>
<span class="upd" id="upd">loading&hellip;</span></header>
<main>
<section class="card wide"><div class="tiles" id="tiles"></div></section>
<section class="card wide"><h2>Runs</h2><div id="runs"></div></section>
<section class="card wide"><h2>Workers</h2><div id="workers"></div></section>
<section class="card"><h2>Chain-draws/s over time</h2><div id="spark"></div></section>
<section class="card"><h2>Convergence <span class="muted" id="convrun"></span></h2><div id="conv"></div></section>
</main>
<script>
(function(){
"use strict";
var INITIAL = /*INITIAL*/null;
var COLORS = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#17becf"];
function esc(s){return String(s).replace(/[&<>"']/g,function(c){return {"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c];});}
function fmt(x,d){if(x===null||x===undefined||isNaN(x))return "–";d=(d===undefined)?1:d;
  return Number(x).toLocaleString("en-US",{maximumFractionDigits:Math.abs(x)>=1000?0:d,minimumFractionDigits:0});}
function bar(cls,frac,text){frac=Math.max(0,Math.min(1,frac||0));
  return '<div class="bar '+cls+'"><div style="width:'+(100*frac).toFixed(1)+'%"></div><span>'+text+'</span></div>';}
function dur(s){if(s===null||s===undefined||!isFinite(s))return "–";s=Math.round(s);
  return (s>=3600?Math.floor(s/3600)+"h ":"")+(s>=60?Math.floor(s%3600/60)+"m ":"")+(s%60)+"s";}
function tile(k,v){return '<div class="tile"><div class="v">'+v+'</div><div class="k">'+k+'</div></div>';}
function runsSorted(p){return Object.keys(p||{}).map(function(k){return p[k];})
  .sort(function(a,b){return (b.published_at||0)-(a.published_at||0);});}
function renderTiles(ws){var d=0,g=0,b=0,v=0;ws.forEach(function(w){d+=w.chain_draws_per_s;g+=w.grad_evals_per_s;b+=w.blocks_done;v+=w.divergences;});
  document.getElementById("tiles").innerHTML=tile("workers",ws.length)+tile("chain-draws / s",fmt(d))+
    tile("grad-evals / s",fmt(g))+tile("blocks done (workers)",fmt(b,0))+tile("divergences",fmt(v,0));}
function renderWorkers(ws){
  var md=1e-9,mg=1e-9;ws.forEach(function(w){md=Math.max(md,w.chain_draws_per_s);mg=Math.max(mg,w.grad_evals_per_s);});
  var h='<table><tr><th>worker</th><th>chain-draws/s</th><th>grad-evals/s</th><th>blocks</th><th>acceptance</th><th>divergences</th><th>compile s</th><th>run / phase</th></tr>';
  ws.forEach(function(w,i){
    h+='<tr data-worker="'+esc(w.worker)+'"><td><span style="color:'+COLORS[i%COLORS.length]+'">&#9632;</span> '+esc(w.worker)+'</td>'+
      '<td>'+bar("b1",w.chain_draws_per_s/md,'<span class="rate" data-worker="'+esc(w.worker)+'" data-metric="chain_draws_per_s">'+fmt(w.chain_draws_per_s)+'</span>')+'</td>'+
      '<td>'+bar("b2",w.grad_evals_per_s/mg,'<span class="rate" data-worker="'+esc(w.worker)+'" data-metric="grad_evals_per_s">'+fmt(w.grad_evals_per_s)+'</span>')+'</td>'+
      '<td class="num">'+fmt(w.blocks_done,0)+'</td><td class="num">'+(w.blocks_done?fmt(w.acceptance,3):"–")+'</td>'+
      '<td class="num'+(w.divergences?' bad':'')+'">'+fmt(w.divergences,0)+'</td><td class="num">'+fmt(w.compile_seconds,1)+'</td>'+
      '<td>'+esc(w.run_id||"–")+(w.phase?' <span class="badge">'+esc(w.phase)+'</span>':'')+'</td></tr>';});
  document.getElementById("workers").innerHTML=ws.length?h+'</table>':'<span class="muted">no workers connected</span>';}
function renderRuns(p){var rs=runsSorted(p);
  if(!rs.length){document.getElementById("runs").innerHTML='<span class="muted">no progress published yet</span>';return;}
  var h='<table><tr><th>run</th><th>phase</th><th>blocks</th><th>draws</th><th>chains</th><th>elapsed</th><th>ETA</th></tr>';
  rs.forEach(function(r){var f=r.blocks_total?r.blocks_done/r.blocks_total:0;
    var eta=(f>0&&f<1)?r.elapsed_s*(1-f)/f:(f>=1?0:null);
    h+='<tr><td>'+esc(r.run_id)+'</td><td><span class="badge">'+esc(r.phase)+'</span></td><td>'+
      bar("bp",f,fmt(r.blocks_done,0)+' / '+fmt(r.blocks_total,0)+' ('+fmt(100*f,0)+'%)')+'</td><td class="num">'+fmt(r.draws_done,0)+' / '+
      fmt(r.draws_total,0)+'</td><td class="num">'+fmt(r.chains,0)+'</td><td class="num">'+dur(r.elapsed_s)+'</td><td class="num">'+dur(eta)+'</td></tr>';});
  document.getElementById("runs").innerHTML=h+'</table>';}
function poly(pts,W,H,x0,x1,ymax,color,width){if(!pts.length)return "";
  return '<polyline fill="none" stroke="'+color+'" stroke-width="'+width+'" stroke-linejoin="round" points="'+pts.map(function(p){
    return (44+(W-54)*(p[0]-x0)/Math.max(x1-x0,1e-9)).toFixed(1)+','+(H-20-(H-34)*p[1]/ymax).toFixed(1);}).join(" ")+'"/>';}
function axes(W,H,top,left,right,bottom){return '<line x1="44" y1="'+(H-20)+'" x2="'+(W-10)+'" y2="'+(H-20)+'" stroke="#ccd"/>'+
  '<line x1="44" y1="14" x2="'+(W-10)+'" y2="14" stroke="#eef" stroke-dasharray="4 3"/>'+
  '<text x="2" y="18">'+top+'</text><text x="2" y="'+(H-22)+'">'+(bottom||"0")+'</text>'+
  '<text x="44" y="'+(H-4)+'">'+left+'</text><text x="'+(W-10)+'" y="'+(H-4)+'" text-anchor="end">'+right+'</text>';}
function renderSpark(h,ws){var W=560,H=200,el=document.getElementById("spark");
  if(!h||!h.t||h.t.length<2){el.innerHTML='<span class="muted">collecting samples&hellip;</span>';return;}
  var t=h.t,x0=t[0],x1=t[t.length-1],ymax=Math.max(1e-9,Math.max.apply(null,h.total));
  var zip=function(ys){return ys.map(function(y,i){return [t[i],y];});};
  var s='<svg width="100%" viewBox="0 0 '+W+' '+H+'">'+axes(W,H,fmt(ymax,0),"-"+Math.round(x1-x0)+" s","now");
  s+=poly(zip(h.total),W,H,x0,x1,ymax,"#1d3557",2.5);
  var order=ws.map(function(w){return w.worker;});
  Object.keys(h.workers).forEach(function(a){var i=order.indexOf(a);
    s+=poly(zip(h.workers[a]),W,H,x0,x1,ymax,COLORS[(i<0?0:i)%COLORS.length],1.5);});
  el.innerHTML=s+'</svg><div class="muted">thick: total &middot; thin: per worker (colours as in the Workers table)</div>';}
function renderConv(p,h){var r=runsSorted(p)[0],el=document.getElementById("conv");
  if(!r||!r.convergence||!Object.keys(r.convergence).length){el.innerHTML='<span class="muted">no convergence diagnostics yet</span>';return;}
  document.getElementById("convrun").textContent="("+r.run_id+", after "+r.blocks_done+" blocks)";
  var rows='<table><tr><th>parameter</th><th>split R-hat</th><th>bulk ESS</th></tr>';
  Object.keys(r.convergence).sort().forEach(function(k){var c=r.convergence[k],bad=!(c.rhat!==null&&c.rhat<1.01);
    rows+='<tr><td>'+esc(k)+'</td><td class="num '+(bad?'bad':'ok')+'">'+fmt(c.rhat,3)+'</td><td class="num">'+fmt(c.ess_bulk,0)+'</td></tr>';});
  rows+='</table><div class="muted">green: R-hat &lt; 1.01</div>';
  var hist=(h&&h.rhat&&h.rhat[r.run_id])||[];
  if(hist.length>1){var W=560,H=110,top=Math.max.apply(null,hist.map(function(x){return x[1];}).concat([1.02]));
    var pts=hist.map(function(x){return [x[0],x[1]-1];}),b0=hist[0][0],b1=hist[hist.length-1][0];
    var y01=H-20-(H-34)*0.01/(top-1);
    rows+='<svg width="100%" viewBox="0 0 '+W+' '+H+'">'+axes(W,H,fmt(top,3),"block "+b0,"max R-hat, block "+b1,"1.000")+
      '<line x1="44" x2="'+(W-10)+'" y1="'+y01.toFixed(1)+'" y2="'+y01.toFixed(1)+'" stroke="#1e8449" stroke-dasharray="5 3"/>'+
      poly(pts,W,H,b0,b1,top-1,"#c0392b",2)+'</svg>';}
  el.innerHTML=rows;}
function render(d){document.getElementById("sched").textContent=d.scheduler||location.host;
  renderTiles(d.workers);renderWorkers(d.workers);renderRuns(d.progress);renderSpark(d.history,d.workers);renderConv(d.progress,d.history);
  document.getElementById("upd").textContent="updated "+new Date().toLocaleTimeString("en-GB");}
function getJSON(u){return fetch(u,{cache:"no-store"}).then(function(r){if(!r.ok)throw new Error(r.status);return r.json();});}
var base=location.pathname.replace(/\/+$/,"")+"/api/";
function poll(){Promise.all([getJSON(base+"workers"),getJSON(base+"progress"),getJSON(base+"history")]).then(function(v){
  render({workers:v[0],progress:v[1],history:v[2],scheduler:INITIAL&&INITIAL.scheduler});}).catch(function(e){
  document.getElementById("upd").textContent="connection lost ("+e.message+")";});}
if(INITIAL)render(INITIAL);
setInterval(poll,1000);
})();
</script></body></html>
"""
