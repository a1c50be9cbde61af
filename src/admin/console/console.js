// The tollgate console. Every value that comes from the gateway — route
// and limit names, identities, API-key digests, header values, paths — is
// put into the page as text (textContent, text nodes, attribute values set
// one by one), never as markup; the page's Content-Security-Policy allows
// no inline script either. The admin token lives in sessionStorage under
// `tollgate.token` and travels as a bearer header, never in a cookie.
'use strict';

const KEY = 'tollgate.token';
const OUTCOMES = ['allowed', 'limited', 'shadow_limited', 'exempt', 'errors'];
const KEEP = 900;
const POLL_MS = 1500;

const state = {
  view: 'now', fleet: [], local: [], since: 0, timer: null, minutes: 1, denied: null,
};

function $(id) { return document.getElementById(id); }

// An element with attributes (strings, set one by one) and children
// (elements, or anything else as text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'on') for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function clear(node) { node.replaceChildren(); return node; }

function token() { return sessionStorage.getItem(KEY); }

// Calls the admin API with the token; a 401 sends the operator back to the
// login prompt, a 403 (no token configured) to the page that says how to
// set one.
async function api(path, init) {
  const opts = Object.assign({ headers: {} }, init || {});
  opts.headers = Object.assign({ Authorization: 'Bearer ' + (token() || '') }, opts.headers);
  opts.credentials = 'omit';
  opts.cache = 'no-store';
  const res = await fetch(path, opts);
  if (res.status === 401) { showLogin('The token was refused; log in again.'); throw new Error('unauthorized'); }
  if (res.status === 403) { showNoToken(); throw new Error('no token configured'); }
  let body = null;
  const type = res.headers.get('content-type') || '';
  if (type.includes('json')) body = await res.json();
  else body = await res.text();
  if (!res.ok) {
    const detail = body && body.detail ? body.detail : String(body);
    const field = body && body.field ? body.field + ': ' : '';
    throw new Error(field + detail);
  }
  return body;
}

function hideAll() {
  for (const id of ['login', 'no-token']) $(id).hidden = true;
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
  $('tabs').hidden = true;
  $('logout').hidden = true;
}

function showLogin(message) {
  stopPolling();
  hideAll();
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  $('token').focus();
}

function showNoToken() {
  stopPolling();
  sessionStorage.removeItem(KEY);
  hideAll();
  $('scope').textContent = '';
  $('no-token').hidden = false;
}

function stopPolling() {
  if (state.timer) clearTimeout(state.timer);
  state.timer = null;
}

// ---- routing between views -------------------------------------------

function route() {
  if (!token()) { probeWithoutToken(); return; }
  const hash = location.hash.replace(/^#/, '') || 'now';
  const [view, query] = hash.split('?');
  state.view = ['now', 'limited', 'caller', 'replays'].includes(view) ? view : 'now';
  hideAll();
  $('tabs').hidden = false;
  $('logout').hidden = false;
  for (const a of document.querySelectorAll('#tabs a')) {
    a.classList.toggle('active', a.dataset.view === state.view);
  }
  $('view-' + state.view).hidden = false;
  stopPolling();
  if (state.view === 'now') pollNow();
  if (state.view === 'limited') pollDenied();
  if (state.view === 'caller') openCaller(new URLSearchParams(query || ''));
  if (state.view === 'replays') loadReplays();
}

// Without a token the page asks the gateway whether one is configured:
// 403 says none is (and how to set one), 401 asks for it.
async function probeWithoutToken() {
  try {
    const res = await fetch('/admin/console/now', { credentials: 'omit', cache: 'no-store' });
    if (res.status === 403) { showNoToken(); return; }
  } catch (_) { /* the login prompt is all there is to show */ }
  showLogin('');
}

// ---- Now ----------------------------------------------------------------

function keep(list, more) {
  const out = list.concat(more);
  return out.length > KEEP ? out.slice(out.length - KEEP) : out;
}

async function pollNow() {
  try {
    const now = await api('/admin/console/now?since=' + state.since);
    state.fleet = keep(state.fleet, now.fleet);
    state.local = keep(state.local, now.local);
    const last = state.local.length ? state.local[state.local.length - 1].at : state.since;
    state.since = Math.max(state.since, last);
    renderScope(now.scope, now.gateways);
    renderNow(now);
  } catch (e) {
    if (e.message === 'unauthorized' || e.message === 'no token configured') return;
    $('now-note').textContent = 'Could not read the gateway: ' + e.message;
  }
  if (state.view === 'now') state.timer = setTimeout(pollNow, POLL_MS);
}

function renderScope(scope, gateways) {
  $('scope').textContent = scope === 'fleet'
    ? 'fleet: ' + gateways + (gateways === 1 ? ' gateway' : ' gateways')
    : 'this gateway only (no Redis)';
}

function card(label, value, bad) {
  return el('div', { class: bad ? 'card bad' : 'card' }, el('b', {}, value), label);
}

function renderNow(now) {
  const s = now.store;
  $('now-note').textContent = now.scope === 'fleet'
    ? 'Counts are the fleet\'s: every live gateway publishes its own once a second. Latency is the slowest gateway\'s.'
    : 'Without Redis this page shows one gateway: this one.';
  clear($('store')).append(
    card('store', s.kind === 'redis' ? (s.connected ? 'redis connected' : 'redis unreachable') : 'memory', s.kind === 'redis' && !s.connected),
    card('breaker', s.breaker, s.breaker !== 'closed'),
    card('sync mode', s.sync_ms ? 'every ' + s.sync_ms + ' ms' : 'off'),
    card('fallback (on_error: ' + s.on_error + ')', s.fallback ? 'in use' : 'not in use', s.fallback),
    card('live gateways', s.live_instances),
    card('ready', s.ready ? 'yes' : 'no', !s.ready),
  );
  if (s.fault) $('store').append(card('redis refuses', s.fault, true));
  renderRoutes();
  renderPools(now.pools || []);
}

function routeNames() {
  const names = [];
  for (const sec of state.fleet) for (const r of sec.routes) if (!names.includes(r.route)) names.push(r.route);
  return names;
}

function series(route, key) {
  return state.fleet.map((sec) => {
    const r = sec.routes.find((x) => x.route === route);
    return r ? (r[key] || 0) : 0;
  });
}

function renderRoutes() {
  const box = clear($('routes'));
  for (const name of routeNames()) {
    const lines = OUTCOMES.map((o) => [o, series(name, o)]);
    const legend = el('div', { class: 'legend' });
    for (const [o, values] of lines) {
      const current = values.length ? values[values.length - 1] : 0;
      const recent = values.slice(-60);
      const peak = recent.length ? Math.max(...recent) : 0;
      legend.append(el('span', { 'data-outcome': o, 'data-now': current, 'data-peak': peak },
        el('i', { class: 'k-' + o }), o.replace('_', ' ') + ' ' + current + '/s (peak ' + peak + ')'));
    }
    const latency = latencyOf(name);
    box.append(el('div', { class: 'route', 'data-route': name },
      el('h3', {}, name), chart(lines), legend,
      el('div', { class: 'note' }, 'upstream p50 ' + latency.p50 + ', p99 ' + latency.p99 + ' (last 10 s)')));
  }
  if (!box.children.length) box.append(el('p', { class: 'note' }, 'No samples yet; the first comes within a second.'));
}

function latencyOf(route) {
  const recent = state.fleet.slice(-10);
  const pick = (k) => {
    const v = recent.map((s) => (s.routes.find((r) => r.route === route) || {})[k]).filter((x) => x !== undefined);
    return v.length ? Math.max(...v) + ' ms' : '–';
  };
  return { p50: pick('p50_ms'), p99: pick('p99_ms') };
}

// One SVG line per outcome over the seconds held, scaled to the peak.
function chart(lines) {
  const W = 900, H = 120, n = KEEP;
  const peak = Math.max(1, ...lines.flatMap(([, v]) => v));
  const root = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img' });
  root.append(svg('rect', { x: 0, y: 0, width: W, height: H, fill: '#fff' }));
  const colors = { allowed: '#2f7d4f', limited: '#c0392b', shadow_limited: '#d68910', exempt: '#2e6da4', errors: '#7d3c98' };
  for (const [o, values] of lines) {
    if (!values.some((v) => v > 0)) continue;
    const offset = n - values.length;
    const pts = values.map((v, i) => ((offset + i) * W / (n - 1)).toFixed(1) + ',' + (H - 2 - v * (H - 4) / peak).toFixed(1));
    root.append(svg('polyline', { points: pts.join(' '), fill: 'none', stroke: colors[o], 'stroke-width': 1.5 }));
  }
  const label = svg('text', { x: 4, y: 12, 'font-size': 11, fill: '#5d6678' });
  label.textContent = 'peak ' + peak + '/s';
  root.append(label);
  return root;
}

function renderPools(pools) {
  const box = clear($('pools'));
  if (!pools.length) { box.append(el('p', { class: 'note' }, 'No pools are configured.')); return; }
  for (const p of pools) {
    const t = el('table', {}, el('tr', {}, ...['target', 'address', 'weight', 'healthy', 'ejected', 'ejections', 'in flight'].map((h) => el('th', {}, h))));
    for (const x of p.targets) {
      t.append(el('tr', {}, el('td', { class: 'id' }, x.target), el('td', { class: 'id' }, x.address || '–'),
        el('td', { class: 'num' }, x.weight), el('td', {}, x.healthy ? 'yes' : 'no'), el('td', {}, x.ejected ? 'yes' : 'no'),
        el('td', { class: 'num' }, x.ejections), el('td', { class: 'num' }, x.in_flight)));
    }
    box.append(el('h3', {}, p.name + ' (' + (p.balance || '') + ')'), t);
  }
}

// ---- Who is limited -----------------------------------------------------

async function pollDenied() {
  try {
    const d = await api('/admin/console/denied');
    state.denied = d;
    renderScope(d.scope, d.gateways);
    renderDenied();
  } catch (e) {
    if (e.message === 'unauthorized' || e.message === 'no token configured') return;
    $('limited-note').textContent = 'Could not read the gateway: ' + e.message;
  }
  if (state.view === 'limited') state.timer = setTimeout(pollDenied, POLL_MS);
}

// The caller view's query for an identity as `/admin/top` shows it: the
// API key's digest, which the support API takes in the key's place. Other
// values are digests no lookup can take back.
function callerLink(identity) {
  const key = identity.split(',').find((p) => p.startsWith('key='));
  if (!key) return null;
  const q = new URLSearchParams({ api_key: key.slice(4) });
  return '#caller?' + q.toString();
}

function renderDenied() {
  const d = state.denied;
  for (const b of document.querySelectorAll('.windows button')) {
    b.classList.toggle('active', Number(b.dataset.minutes) === state.minutes);
  }
  $('limited-note').textContent = (d.scope === 'fleet'
    ? 'Denials across ' + d.gateways + (d.gateways === 1 ? ' gateway' : ' gateways') + ' (fleet-wide).'
    : 'Denials on this gateway (no Redis: it shows one gateway).')
    + ' Identities are shown as /admin/top shows them: API keys, IPs and users by their digest.';
  const box = clear($('limited'));
  const limits = d.limits.filter((l) => l.minutes === state.minutes);
  if (!limits.length) { box.append(el('p', { class: 'note' }, 'Nobody was denied in the last ' + state.minutes + ' min.')); return; }
  for (const l of limits) {
    const t = el('table', { 'data-limit': l.route + '/' + l.limit },
      el('tr', {}, el('th', {}, 'caller'), el('th', {}, 'denied'), el('th', {}, '')));
    for (const [identity, count] of l.top) {
      const href = callerLink(identity);
      t.append(el('tr', {}, el('td', { class: 'id' }, identity), el('td', { class: 'num' }, count),
        el('td', {}, href ? el('a', { href: href, class: 'look-up' }, 'look up') : '')));
    }
    box.append(el('h3', {}, l.route + ' / ' + l.limit + ': ' + l.denied + ' denied'), t);
  }
}

// ---- One caller -----------------------------------------------------------

function callerQuery(form) {
  const q = new URLSearchParams();
  for (const f of ['ip', 'api_key', 'user']) {
    const v = form.elements[f].value.trim();
    if (v) q.set(f, v);
  }
  const hn = form.elements.header_name.value.trim();
  if (hn) q.set('header.' + hn, form.elements.header_value.value);
  return q;
}

function openCaller(params) {
  const form = $('caller-form');
  for (const f of ['ip', 'api_key', 'user']) form.elements[f].value = params.get(f) || '';
  let header = null;
  for (const [k, v] of params) if (k.startsWith('header.')) header = [k.slice(7), v];
  form.elements.header_name.value = header ? header[0] : '';
  form.elements.header_value.value = header ? header[1] : '';
  if ([...params.keys()].length) lookUp();
  else { clear($('caller')); $('override-box').hidden = true; }
}

async function lookUp() {
  const q = callerQuery($('caller-form'));
  $('caller-error').textContent = '';
  const box = clear($('caller'));
  if (![...q.keys()].length) { $('caller-error').textContent = 'Name a caller: IP, API key, user or a header.'; return; }
  try {
    const [found, overrides] = await Promise.all([
      api('/admin/callers?' + q.toString()),
      api('/admin/overrides'),
    ]);
    renderCaller(q, found, overrides);
  } catch (e) {
    if (e.message !== 'unauthorized' && e.message !== 'no token configured') $('caller-error').textContent = e.message;
  }
}

function renderCaller(q, found, overrides) {
  const box = clear($('caller'));
  const t = el('table', { id: 'caller-limits' }, el('tr', {}, ...['route', 'limit', 'identity', 'used', 'remaining', 'quota', 'resets in', 'override', ''].map((h) => el('th', {}, h))));
  for (const l of found.limits) {
    const reset = el('button', { type: 'button', class: 'reset', on: { click: () => resetCaller(q, l.route + '/' + l.limit) } }, 'Reset');
    t.append(el('tr', { 'data-limit': l.route + '/' + l.limit },
      el('td', {}, l.route), el('td', {}, l.limit), el('td', { class: 'id' }, l.identity + (l.shared ? ' (' + l.shared + ')' : '')),
      el('td', { class: 'num used' }, l.used), el('td', { class: 'num remaining' }, l.remaining), el('td', { class: 'num' }, l.quota),
      el('td', { class: 'num' }, l.reset_s + ' s'), el('td', { class: 'id' }, l.override ? JSON.stringify(l.override) : ''), el('td', {}, reset)));
  }
  box.append(t);
  if (!found.limits.length) box.append(el('p', { class: 'note' }, 'No counted limit applies to this caller.'));
  if (found.exempt_routes.length) box.append(el('p', { class: 'note' }, 'Exempt on: ' + found.exempt_routes.join(', ')));
  box.append(el('button', { type: 'button', id: 'reset-all', on: { click: () => resetCaller(q, null) } }, 'Reset every limit'));
  const mine = overrides.overrides ? overrides.overrides : (Array.isArray(overrides) ? overrides : []);
  // An API key's override is shown by the key's digest, as the rows'
  // identities show it.
  const subject = [...q.entries()];
  for (const l of found.limits) {
    const m = /(?:^|,)key=(sha256:[0-9a-f]+)/.exec(l.identity);
    if (m) subject.push(['api_key', m[1]]);
  }
  const ours = mine.filter((o) => subject.some(([k, v]) => o.caller && o.caller[k] === v));
  const ot = el('table', { id: 'caller-overrides' }, el('tr', {}, ...['caller', 'limit', 'quota', 'plan', 'exempt', 'expires in', ''].map((h) => el('th', {}, h))));
  for (const o of ours) {
    const [field, value] = Object.entries(o.caller)[0];
    const limit = o.limit ? (o.route ? o.route + '/' + o.limit : o.limit) : null;
    ot.append(el('tr', {}, el('td', { class: 'id' }, field + '=' + value), el('td', {}, limit || 'every limit'),
      el('td', { class: 'num' }, o.quota === null || o.quota === undefined ? '' : o.quota), el('td', {}, o.plan || ''),
      el('td', {}, o.exempt ? 'yes' : ''), el('td', { class: 'num expires' }, o.expires_in_s === null || o.expires_in_s === undefined ? 'never' : o.expires_in_s + ' s'),
      el('td', {}, el('button', { type: 'button', on: { click: () => removeOverride(field, value, limit) } }, 'Remove'))));
  }
  box.append(el('h2', {}, 'Overrides'), ours.length ? ot : el('p', { class: 'note' }, 'None.'));
  $('override-box').hidden = false;
}

async function resetCaller(q, limit) {
  const p = new URLSearchParams(q);
  if (limit) p.set('limit', limit);
  try {
    const r = await api('/admin/callers?' + p.toString(), { method: 'DELETE' });
    $('caller-error').textContent = 'Reset ' + r.reset.length + (r.reset.length === 1 ? ' limit.' : ' limits.');
    await lookUp();
    $('caller-error').textContent = 'Reset ' + r.reset.length + (r.reset.length === 1 ? ' limit.' : ' limits.');
  } catch (e) { $('caller-error').textContent = e.message; }
}

async function removeOverride(field, value, limit) {
  const p = new URLSearchParams();
  p.set(field, value);
  if (limit) p.set('limit', limit);
  try {
    await api('/admin/overrides?' + p.toString(), { method: 'DELETE' });
    await lookUp();
  } catch (e) { $('override-result').textContent = e.message; }
}

async function setOverride(ev) {
  ev.preventDefault();
  const f = ev.target.elements;
  const body = {};
  for (const [k, v] of callerQuery($('caller-form'))) body[k] = v;
  if (f.limit.value.trim()) body.limit = f.limit.value.trim();
  if (f.quota.value) body.quota = Number(f.quota.value);
  if (f.window.value.trim()) body.window = f.window.value.trim();
  if (f.plan.value.trim()) body.plan = f.plan.value.trim();
  if (f.exempt.checked) body.exempt = true;
  if (f.ttl.value.trim()) body.ttl = f.ttl.value.trim();
  try {
    await api('/admin/overrides', { method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    $('override-result').textContent = 'Override set.';
    await lookUp();
  } catch (e) { $('override-result').textContent = e.message; }
}

// ---- Replays --------------------------------------------------------------

async function loadReplays() {
  const list = clear($('replays'));
  try {
    const r = await api('/admin/console/replays');
    if (!r.configured) { list.append(el('li', { class: 'note' }, 'No folder is configured: set admin.replays to the folder simulate writes its HTML reports to.')); return; }
    if (!r.reports.length) { list.append(el('li', { class: 'note' }, 'The folder holds no .html report.')); return; }
    for (const x of r.reports) {
      list.append(el('li', {}, el('a', { href: x.url, target: '_blank', rel: 'noopener noreferrer' }, x.name), ' ', el('span', { class: 'note' }, x.bytes + ' bytes')));
    }
  } catch (e) {
    if (e.message !== 'unauthorized' && e.message !== 'no token configured') list.append(el('li', { class: 'error' }, e.message));
  }
}

// ---- start ----------------------------------------------------------------

function start() {
  $('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $('token').value);
    $('token').value = '';
    try {
      await api('/admin/console/now?since=' + Number.MAX_SAFE_INTEGER);
      route();
    } catch (e) {
      if (e.message !== 'unauthorized' && e.message !== 'no token configured') $('login-error').textContent = e.message;
    }
  });
  $('logout').addEventListener('click', () => { sessionStorage.removeItem(KEY); showLogin(''); });
  $('caller-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = '#caller?' + callerQuery(ev.target).toString();
  });
  $('override-form').addEventListener('submit', setOverride);
  for (const b of document.querySelectorAll('.windows button')) {
    b.addEventListener('click', () => { state.minutes = Number(b.dataset.minutes); if (state.denied) renderDenied(); });
  }
  window.addEventListener('hashchange', route);
  route();
}

start();
