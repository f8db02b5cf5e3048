// The live page of `aioelastic serve` (docs/ui.md): no build step, no dependencies.
//
// It reads GET /v1/ui/events, server-sent events, with fetch() and a stream reader rather than
// EventSource, because EventSource cannot send an Authorization header and a token must never go
// in a URL (URLs end up in logs and histories). The token the user types is kept in
// sessionStorage: for this tab only. Every "snapshot" event replaces what the page shows; between
// two, lease bars and timer countdowns run down on the page's clock. Everything is written with
// textContent: node ids, addresses and lock holders come from the store, never as HTML.
'use strict';

const TOKEN_KEY = 'aioelastic.token';
const MAX_EVENTS = 200;
const RETRY_MAX_MS = 5000;
// The server sends a snapshot at least every second; a stream silent for longer than this is dead
// (a network that drops packets without closing the connection).
const SILENCE_MS = 5000;

let selected = runFromHash();
let controller = null;
let retries = 0;
let retryTimer = null;
let everConnected = false;
let serverStopping = false;
let received = 0; // performance.now() of the last snapshot
let heard = 0; // performance.now() of the last event of any kind
let streaming = false;
let lostBecause = null; // what the banner says since the connection was lost

const $ = (id) => document.getElementById(id);

function runFromHash() {
  const match = location.hash.match(/^#run=(.+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === 'class') node.className = value;
    else if (key.startsWith('data-')) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setConn(kind, text) {
  const conn = $('conn');
  conn.className = 'conn ' + kind;
  conn.textContent = text;
}

// -- the stream

async function connect() {
  clearTimeout(retryTimer);
  if (controller) controller.abort();
  const mine = (controller = new AbortController());
  const headers = { Accept: 'text/event-stream' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const url = '/v1/ui/events' + (selected ? '?run=' + encodeURIComponent(selected) : '');
  let response;
  try {
    response = await fetch(url, { headers, signal: mine.signal, cache: 'no-store' });
  } catch (error) {
    if (!mine.signal.aborted) lost('cannot reach the server');
    return;
  }
  if (response.status === 401) {
    askForToken(token ? 'The server refused the token. Enter the right one.' : 'This server needs a token.');
    return;
  }
  if (!response.ok) {
    let message = 'the server answered ' + response.status;
    try { message += ': ' + (await response.json()).message; } catch (error) { /* not JSON */ }
    lost(message);
    return;
  }
  $('auth').hidden = true;
  retries = 0;
  lostBecause = null;
  serverStopping = false;
  setConn('ok', everConnected ? 'connected again at ' + clock(Date.now() / 1000) : 'connected');
  everConnected = true;
  received = heard = performance.now();
  streaming = true;
  try {
    await readEvents(response.body, onEvent);
  } catch (error) {
    if (mine.signal.aborted) return;
    console.error('the event stream failed:', error);
  } finally {
    if (controller === mine) streaming = false;
  }
  if (!mine.signal.aborted) lost(serverStopping ? 'the server stopped' : 'the stream ended');
}

async function readEvents(body, handle) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (data.length) handle(name, JSON.parse(data.join('\n')));
    }
  }
}

function lost(why) {
  // the first reason stays on show (why it was lost); later ones say why it is not back yet
  if (!lostBecause) lostBecause = 'connection lost at ' + clock(Date.now() / 1000) + ': ' + why;
  const now = lostBecause.endsWith(why) ? '' : ' (' + why + ')';
  const delay = Math.min(RETRY_MAX_MS, 500 * 2 ** retries++);
  setConn('lost', lostBecause + now + '; retrying in ' + Math.round(delay / 1000) + ' s');
  document.body.classList.add('stale');
  retryTimer = setTimeout(connect, delay);
}

function askForToken(message) {
  setConn('auth', 'not connected: a token is needed');
  $('auth-message').textContent = message;
  $('auth').hidden = false;
  $('token').focus();
}

function onEvent(name, data) {
  heard = performance.now();
  if (name === 'snapshot') {
    document.body.classList.remove('stale');
    render(data);
  } else if (name === 'closing') {
    serverStopping = true;
    setConn('lost', 'the server is shutting down');
  }
}

// -- rendering

function render(snapshot) {
  received = performance.now();
  if (!selected && snapshot.run_id) selected = snapshot.run_id; // kept when reconnecting
  $('revision').textContent = 'store revision ' + snapshot.revision;
  renderRuns(snapshot.runs, snapshot.run_id);
  renderRun(snapshot.run_id, snapshot.run, snapshot.error);
  fill('queues', snapshot.queues, (q) => el('tr', { 'data-name': q.name },
    el('td', {}, q.name), el('td', {}, q.holder), el('td', { class: 'num' }, q.fencing_token),
    el('td', {}, leaseBar(q.lease_remaining, q.lease_ttl)), el('td', { class: 'num' }, q.waiting)));
  for (const event of snapshot.events) logEvent(event);
  tick();
}

function renderRuns(runs, current) {
  const nav = $('runs');
  nav.replaceChildren(...runs.map((id) => el('a', {
    href: '#run=' + encodeURIComponent(id), class: id === current ? 'current' : '',
  }, id)));
  if (!runs.length) nav.append(el('span', { class: 'muted' }, 'no runs in the store'));
}

function renderRun(runId, run, error) {
  $('run-id').textContent = runId || '–';
  $('run-error').hidden = !error;
  $('run-error').textContent = error || '';
  const state = $('run-state');
  if (!run) {
    state.textContent = runId ? 'no records' : '';
    state.className = 'badge';
    for (const id of ['members', 'waiting', 'standby', 'timers']) fill(id, [], () => null);
    for (const id of ['round', 'master', 'forming', 'driver']) $(id).textContent = '–';
    return;
  }
  if (run.closed) {
    state.textContent = 'closed after round ' + run.closed_after_round;
    state.className = 'badge closed';
  } else {
    state.textContent = run.reopened ? 'open (reopened)' : 'open';
    state.className = 'badge open';
  }
  $('round').textContent = run.round === null ? 'none yet' : run.round + ' (world size ' + run.members.length + ')';
  $('master').textContent = run.master_addr ? run.master_addr + ':' + run.master_port : '–';
  $('forming').textContent = run.forming_round;
  $('driver').textContent = run.driver || 'none';
  fill('members', run.members, (m) => el('tr', {
    'data-node': m.node_id, 'data-rank': m.rank, class: m.alive ? 'alive' : 'gone',
  }, el('td', { class: 'num rank' }, m.rank), el('td', { class: 'node' }, m.node_id),
  el('td', {}, m.addr || '–'), el('td', {}, leaseBar(m.lease_remaining, m.lease_ttl)),
  el('td', { class: 'state' }, (m.alive ? 'alive' : 'gone') + (m.rejoined ? ', rejoining' : ''))));
  const node = (n) => el('tr', { 'data-node': n.node_id }, el('td', { class: 'node' }, n.node_id),
    el('td', {}, n.addr), el('td', {}, leaseBar(n.lease_remaining, n.lease_ttl)));
  fill('waiting', run.waiting, node);
  fill('standby', run.standby, node);
  fill('timers', run.timers, (t) => el('tr', { 'data-scope': t.scope_id },
    el('td', {}, t.worker_id), el('td', {}, t.scope_id), el('td', { class: 'num' }, t.pid ?? '–'),
    el('td', { class: 'countdown', 'data-left': t.time_left })));
}

function fill(id, items, row) {
  const body = $(id).tBodies[0];
  const rows = items.map(row);
  if (!rows.length) {
    const columns = $(id).tHead.rows[0].cells.length;
    rows.push(el('tr', { class: 'empty' }, el('td', { colSpan: columns }, 'none')));
  }
  body.replaceChildren(...rows);
}

function leaseBar(remaining, ttl) {
  if (remaining === null || remaining === undefined) return el('span', { class: 'muted' }, '–');
  const fillBar = el('span', { class: 'fill' });
  return el('span', { class: 'lease', 'data-left': remaining, 'data-ttl': ttl || remaining },
    el('span', { class: 'bar' }, fillBar), el('span', { class: 'secs' }));
}

function logEvent(event) {
  const list = $('events');
  list.prepend(el('li', { class: 'event ' + event.kind },
    el('time', {}, clock(event.time)), el('span', { class: 'kind' }, event.kind), ' ', event.text));
  while (list.children.length > MAX_EVENTS) list.lastChild.remove();
}

function clock(epoch) {
  return new Date(epoch * 1000).toLocaleTimeString([], { hour12: false });
}

// Lease bars and timers run down between snapshots on the page's own clock.
function tick() {
  const elapsed = (performance.now() - received) / 1000;
  if (streaming && performance.now() - heard > SILENCE_MS) {
    streaming = false;
    controller.abort();
    lost('no word from the server for ' + SILENCE_MS / 1000 + ' s');
  }
  for (const lease of document.querySelectorAll('.lease')) {
    const left = Math.max(0, Number(lease.dataset.left) - elapsed);
    const share = Math.min(1, left / Number(lease.dataset.ttl));
    const bar = lease.querySelector('.fill');
    bar.style.width = (share * 100).toFixed(1) + '%';
    bar.classList.toggle('low', share < 0.34);
    lease.querySelector('.secs').textContent = left.toFixed(1) + ' s';
  }
  for (const cell of document.querySelectorAll('.countdown')) {
    const left = Number(cell.dataset.left) - elapsed;
    cell.textContent = left >= 0 ? left.toFixed(1) + ' s' : 'overdue ' + (-left).toFixed(1) + ' s';
    cell.classList.toggle('overdue', left < 0);
  }
}

// -- wiring

$('auth').addEventListener('submit', (event) => {
  event.preventDefault();
  const token = $('token').value.trim();
  $('token').value = '';
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  setConn('connecting', 'connecting…');
  connect();
});

window.addEventListener('hashchange', () => {
  selected = runFromHash();
  connect();
});

setInterval(tick, 250);
connect();
