// Validates rendered Kubernetes manifests offline, against the Kubernetes API's OpenAPI
// models as two npm packages ship them (no cluster, no network):
//
//  1. kubernetes-models (JSON-schema validators generated from the OpenAPI spec): the
//     apiVersion/kind pair exists, required fields are there, scalars have the right
//     type and enums a legal value.
//  2. @kubernetes/client-node (classes generated from the OpenAPI spec, v1.34): every
//     field of every object is one the API knows. The schemas of (1) allow unknown
//     fields, as the API server itself does in its default (non-strict) mode, so without
//     this a misspelled `replicsa:` or `contianerPort:` would pass silently.
//
// Then, with --ps-consistency, checks the ps-server topology across objects: the
// StatefulSet's replicas, num-shards and peers in the TOML ConfigMap, the headless
// Service, and the worker Job's completions, parallelism and --workers/--shards.
//
// Usage: node validate-k8s.mjs [--ps-consistency] FILE.yaml...   (multi-document YAML)
// Exit 0 when every object passes, 1 otherwise (each problem printed on stderr).
import { readFileSync } from 'node:fs';
import { parseAllDocuments } from 'yaml';
import * as k8s from '@kubernetes/client-node';

const problems = [];
const report = (where, message) => problems.push(`${where}: ${message}`);

// --- 1. Schema validation (required fields, types, enums) ---------------------------

async function schemaCheck(obj, where) {
  const [group, version] = obj.apiVersion.includes('/')
    ? obj.apiVersion.split('/')
    : ['', obj.apiVersion];
  const module = `kubernetes-models/${group ? `${group}/` : ''}${version}/${obj.kind}`;
  let Model;
  try {
    ({ [obj.kind]: Model } = await import(module));
  } catch {
    report(where, `unknown apiVersion/kind ${obj.apiVersion} ${obj.kind}`);
    return false;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    for (const err of e.errors ?? [e]) {
      const at = err.instancePath || '';
      const detail = err.params?.missingProperty
        ? `missing required field ${err.params.missingProperty}`
        : err.params?.allowedValues
          ? `${err.message}: ${err.params.allowedValues.join(', ')}`
          : err.message;
      report(`${where}${at.replace(/\/(\d+)(?=\/|$)/g, '[$1]').replaceAll('/', '.')}`, detail);
    }
  }
  return true;
}

// --- 2. Unknown fields --------------------------------------------------------------

const pascal = (s) => s.charAt(0).toUpperCase() + s.slice(1);

// client-node names a model <Version><Kind> (V1StatefulSet), or <Group><Version><Kind>
// where two groups share a kind (CoreV1Event, EventsV1Event).
function modelName(obj) {
  const [group, version] = obj.apiVersion.includes('/')
    ? obj.apiVersion.split('/')
    : ['core', obj.apiVersion];
  const groupPrefix = group.split('.')[0].split('-').map(pascal).join('');
  for (const name of [`${groupPrefix}${pascal(version)}${obj.kind}`, `${pascal(version)}${obj.kind}`]) {
    if (typeof k8s[name]?.getAttributeTypeMap === 'function') return name;
  }
  return null;
}

const kScalars = new Set(['string', 'number', 'boolean', 'Date', 'IntOrString']);

function walk(value, type, path) {
  if (value === null || value === undefined) return;
  if (type === 'any' || type === 'object' || kScalars.has(type)) return; // scalars: step 1
  let m = /^Array<(.+)>$/.exec(type);
  if (m) {
    if (!Array.isArray(value)) return report(path, `expected a list, got ${typeof value}`);
    value.forEach((item, i) => walk(item, m[1], `${path}[${i}]`));
    return;
  }
  m = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (m) {
    if (typeof value !== 'object' || Array.isArray(value)) return report(path, 'expected a map');
    for (const [k, v] of Object.entries(value)) walk(v, m[1], `${path}.${k}`);
    return;
  }
  const model = k8s[type];
  if (typeof model?.getAttributeTypeMap !== 'function') {
    return report(path, `internal: no model for type ${type}`);
  }
  if (typeof value !== 'object' || Array.isArray(value)) {
    return report(path, `expected an object (${type}), got ${Array.isArray(value) ? 'a list' : typeof value}`);
  }
  const fields = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    if (!fields.has(k)) {
      const known = [...fields.keys()];
      const close = known.filter((f) => editDistance(f.toLowerCase(), k.toLowerCase()) <= 2);
      report(`${path}.${k}`, `unknown field "${k}" in ${type}` +
        (close.length ? ` (did you mean ${close.map((c) => `"${c}"`).join(' or ')}?)` : ''));
      continue;
    }
    walk(v, fields.get(k), `${path}.${k}`);
  }
}

function editDistance(a, b) {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] !== b[j - 1]));
    }
  }
  return d[a.length][b.length];
}

function strictCheck(obj, where) {
  const name = modelName(obj);
  if (name === null) return report(where, `no OpenAPI model for ${obj.apiVersion} ${obj.kind}`);
  walk(obj, name, where);
}

// --- 3. ps-server topology consistency ------------------------------------------------

// The subset of TOML ps-server reads (docs/configuration.md): flat `key = value`, strings,
// numbers, booleans, arrays possibly over several lines, # comments.
function parseFlatToml(text) {
  const out = new Map();
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    let line = lines[i].replace(/#.*$/, '').trim();
    if (!line) continue;
    const eq = line.indexOf('=');
    if (eq < 0) continue;
    const key = line.slice(0, eq).trim().replaceAll('_', '-');
    let value = line.slice(eq + 1).trim();
    if (value.startsWith('[')) {
      while (!value.includes(']') && i + 1 < lines.length) {
        value += lines[++i].replace(/#.*$/, '').trim();
      }
      value = value.slice(1, value.indexOf(']')).split(',').map((s) => s.trim())
        .filter((s) => s).map((s) => s.replace(/^["']|["']$/g, ''));
    } else {
      value = value.replace(/^["']|["']$/g, '');
    }
    out.set(key, value);
  }
  return out;
}

function argValue(args, flag) {
  for (const a of args ?? []) if (a.startsWith(`${flag}=`)) return a.slice(flag.length + 1);
  return undefined;
}

function consistencyCheck(objects, source) {
  const find = (kind) => objects.filter((o) => o.kind === kind);
  const sts = find('StatefulSet').find((o) => o.metadata?.name === 'ps-shard');
  if (!sts) return report(source, 'no StatefulSet ps-shard');
  const where = `${source}: StatefulSet ps-shard`;
  const svcName = sts.spec.serviceName;
  const svc = find('Service').find((o) => o.metadata?.name === svcName);
  if (!svc) report(where, `serviceName ${svcName} names no Service`);
  else {
    if (svc.spec.clusterIP !== 'None') report(`Service ${svcName}`, 'must be headless (clusterIP: None)');
    if (svc.spec.publishNotReadyAddresses !== true) {
      report(`Service ${svcName}`, 'needs publishNotReadyAddresses: true (shards resolve peers before ready)');
    }
  }
  if (sts.spec.podManagementPolicy !== 'Parallel') {
    report(where, 'podManagementPolicy must be Parallel (a shard is ready only once its peers are up)');
  }
  const cmName = sts.spec.template.spec.volumes?.find((v) => v.name === 'config')?.configMap?.name;
  const cm = find('ConfigMap').find((o) => o.metadata?.name === cmName);
  if (!cm?.data?.['ps-server.toml']) return report(where, `config volume: no ConfigMap ${cmName} with ps-server.toml`);
  const toml = parseFlatToml(cm.data['ps-server.toml']);
  const replicas = sts.spec.replicas ?? 1;
  const numShards = Number(toml.get('num-shards') ?? 1);
  if (numShards !== replicas) report(where, `replicas ${replicas} != num-shards ${numShards} in ps-server.toml`);
  const port = Number(toml.get('port') ?? 7070);
  const expectedPeers = Array.from({ length: replicas }, (_, i) => `${sts.metadata.name}-${i}.${svcName}:${port}`);
  const peers = toml.get('peers') ?? [];
  if (replicas > 1 && peers.join(',') !== expectedPeers.join(',')) {
    report(where, `peers in ps-server.toml [${peers}] != [${expectedPeers}]`);
  }
  const container = sts.spec.template.spec.containers[0];
  // Kubelet gRPC probes are plaintext: with TLS on the main port they must use the
  // health-only listener (health-port); without TLS either port answers.
  const healthPort = toml.has('health-port') ? Number(toml.get('health-port')) : -1;
  const tls = toml.has('tls-cert') || toml.has('tls-ca') || argValue(container.args, '--tls-cert') !== undefined;
  const probePorts = healthPort > 0 ? (tls ? [healthPort] : [healthPort, port]) : (tls ? [] : [port]);
  for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
    if (container[probe]?.grpc && !probePorts.includes(container[probe].grpc.port)) {
      report(where, `${probe} probes port ${container[probe].grpc.port}; plaintext health is on ` +
        `[${probePorts}] (port ${port}${tls ? ' has TLS' : ''}, health-port ${healthPort})`);
    }
  }
  // The TCP data plane listens on data-port, which workers dial on the shard's name: with
  // data-plane = "tcp" it must be a fixed port (0 picks one no manifest can name), and any
  // data-port set must be a containerPort and a port of the Service. With TLS the data
  // port serves the same certificates as port 7070 (docs/data-plane.md, "TLS.").
  const plane = toml.get('data-plane') ?? 'grpc';
  const dataPort = Number(toml.get('data-port') ?? 0);
  if (plane === 'tcp' && dataPort === 0) {
    report(where, 'data-plane = "tcp" needs a fixed data-port (0 picks a free one, which no containerPort or Service port can name)');
  }
  if (dataPort > 0) {
    const exposed = (container.ports ?? []).find((p) => p.containerPort === dataPort);
    if (!exposed) {
      report(where, `data-port ${dataPort} in ps-server.toml: no containerPort ${dataPort} on container ${container.name}`);
    } else if (svc && !(svc.spec.ports ?? []).some((p) => p.port === dataPort &&
        [exposed.name, dataPort, undefined].includes(p.targetPort))) {
      report(`Service ${svcName}`, `no port ${dataPort} for the data plane (data-port in ps-server.toml, targetPort ${exposed.name ?? dataPort})`);
    }
  }
  const drainMs = Number(toml.get('drain-timeout-ms') ?? 10000);
  const grace = sts.spec.template.spec.terminationGracePeriodSeconds ?? 30;
  if (grace * 1000 <= drainMs) {
    report(where, `terminationGracePeriodSeconds ${grace} must exceed drain-timeout-ms ${drainMs}`);
  }
  for (const job of find('Job')) {
    const jw = `${source}: Job ${job.metadata.name}`;
    const workers = Number(toml.get('workers') ?? 1);
    if (job.spec.completionMode !== 'Indexed') report(jw, 'completionMode must be Indexed');
    if (job.spec.completions !== workers) report(jw, `completions ${job.spec.completions} != workers ${workers}`);
    if (job.spec.parallelism !== job.spec.completions) {
      report(jw, 'parallelism must equal completions (a round needs all workers at once)');
    }
    const args = job.spec.template.spec.containers[0].args;
    if (Number(argValue(args, '--workers')) !== workers) report(jw, `--workers != workers ${workers}`);
    if (argValue(args, '--shards') !== expectedPeers.join(',')) {
      report(jw, `--shards ${argValue(args, '--shards')} != ${expectedPeers.join(',')}`);
    }
  }
}

// --- main --------------------------------------------------------------------------

const argv = process.argv.slice(2);
const consistency = argv.includes('--ps-consistency');
const files = argv.filter((a) => a !== '--ps-consistency');
if (files.length === 0) {
  console.error('usage: node validate-k8s.mjs [--ps-consistency] FILE.yaml...');
  process.exit(2);
}
for (const file of files) {
  const objects = [];
  for (const doc of parseAllDocuments(readFileSync(file, 'utf8'))) {
    if (doc.errors.length) {
      report(file, `YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    const where = `${file}: ${obj.kind ?? '?'} ${obj.metadata?.name ?? '?'}`;
    if (typeof obj.apiVersion !== 'string' || typeof obj.kind !== 'string') {
      report(where, 'apiVersion and kind are required');
      continue;
    }
    if (await schemaCheck(obj, where)) strictCheck(obj, where);
    objects.push(obj);
  }
  if (consistency) consistencyCheck(objects, file);
  console.log(`${file}: ${objects.length} objects checked`);
}
for (const p of problems) console.error(`  ${p}`);
if (problems.length) {
  console.error(`validate-k8s: ${problems.length} problem(s)`);
  process.exit(1);
}
