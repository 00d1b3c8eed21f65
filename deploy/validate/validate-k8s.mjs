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
// JobSet (jobset.x-k8s.io/v1alpha2) is a custom resource neither package knows: its own
// fields are checked against the API types transcribed below (section 1b), the Job
// templates inside it with both packages like any Job, and the JobSet webhook's rules
// that a manifest can break (names, dependsOn, policy targets, name lengths).
//
// Then, with --ps-consistency, checks the ps-server topology across objects: the
// StatefulSet's replicas, num-shards and peers in the TOML ConfigMap, the headless
// Service, and the worker Job's completions, parallelism and --workers/--shards; or, for
// a run as a JobSet, the shard and worker Jobs against each other (section 3b).
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
  return modelCheck(obj.apiVersion, obj.kind, obj, where);
}

// Validates value as the model KIND of API version apiVersion (a kind or a nested type
// such as batch/v1 JobTemplateSpec). False when the package has no such model.
async function modelCheck(apiVersion, kind, value, where) {
  const [group, version] = apiVersion.includes('/')
    ? apiVersion.split('/')
    : ['', apiVersion];
  const module = `kubernetes-models/${group ? `${group}/` : ''}${version}/${kind}`;
  let Model;
  try {
    ({ [kind]: Model } = await import(module));
  } catch {
    report(where, `unknown apiVersion/kind ${apiVersion} ${kind}`);
    return false;
  }
  try {
    new Model(value).validate();
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

// --- 1b. JobSet ---------------------------------------------------------------------

// The JobSet API's own types (kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go,
// v0.12): field -> type, where a type is another entry here, 'string', 'boolean', 'int>=0',
// 'enum:A,B', '[]T' (a list), or 'k8s:GROUP/VERSION:Kind' (checked with the Kubernetes
// models). Fields listed under required must be present.
const kJobSetTypes = {
  JobSet: [{ apiVersion: 'string', kind: 'string', metadata: 'k8s:v1:ObjectMeta', spec: 'JobSetSpec', status: 'any' }, ['spec']],
  JobSetSpec: [{
    replicatedJobs: '[]ReplicatedJob', network: 'Network', successPolicy: 'SuccessPolicy',
    failurePolicy: 'FailurePolicy', startupPolicy: 'StartupPolicy', suspend: 'boolean',
    coordinator: 'Coordinator', managedBy: 'string', ttlSecondsAfterFinished: 'int>=0',
    volumeClaimPolicies: '[]VolumeClaimPolicy',
  }, []],
  ReplicatedJob: [{
    name: 'string', groupName: 'string', template: 'k8s:batch/v1:JobTemplateSpec',
    replicas: 'int>=0', dependsOn: '[]DependsOn',
  }, ['name', 'template']],
  DependsOn: [{ name: 'string', status: 'enum:Ready,Complete' }, ['name', 'status']],
  Network: [{ enableDNSHostnames: 'boolean', subdomain: 'string', publishNotReadyAddresses: 'boolean' }, []],
  SuccessPolicy: [{ operator: 'enum:All,Any', targetReplicatedJobs: '[]string' }, ['operator']],
  FailurePolicy: [{
    maxRestarts: 'int>=0', restartStrategy: 'enum:Recreate,BlockingRecreate,InPlaceRestart',
    rules: '[]FailurePolicyRule',
  }, []],
  FailurePolicyRule: [{
    name: 'string',
    action: 'enum:FailJobSet,RestartJobSet,RestartJobSetAndIgnoreMaxRestarts,RestartJob,RestartJobAndIgnoreMaxRestarts',
    onJobFailureReasons: '[]string', onJobFailureMessagePatterns: '[]string',
    targetReplicatedJobs: '[]string',
  }, ['action']],
  StartupPolicy: [{ startupPolicyOrder: 'enum:AnyOrder,InOrder' }, ['startupPolicyOrder']],
  Coordinator: [{ replicatedJob: 'string', jobIndex: 'int>=0', podIndex: 'int>=0' }, ['replicatedJob']],
  VolumeClaimPolicy: [{ templates: '[]k8s:v1:PersistentVolumeClaim', retentionPolicy: 'VolumeRetentionPolicy' }, []],
  VolumeRetentionPolicy: [{ whenDeleted: 'enum:Delete,Retain' }, []],
};

async function jobSetWalk(value, type, path) {
  if (value === null || value === undefined || type === 'any') return;
  if (type.startsWith('[]')) {
    if (!Array.isArray(value)) return report(path, `expected a list, got ${typeof value}`);
    for (let i = 0; i < value.length; i++) await jobSetWalk(value[i], type.slice(2), `${path}[${i}]`);
    return;
  }
  if (type === 'string' || type === 'boolean') {
    if (typeof value !== type) report(path, `must be a ${type}, got ${JSON.stringify(value)}`);
    return;
  }
  if (type === 'int>=0') {
    if (!Number.isInteger(value) || value < 0) report(path, `must be an integer >= 0, got ${JSON.stringify(value)}`);
    return;
  }
  if (type.startsWith('enum:')) {
    const allowed = type.slice(5).split(',');
    if (!allowed.includes(value)) report(path, `must be one of ${allowed.join(', ')}, got ${JSON.stringify(value)}`);
    return;
  }
  if (type.startsWith('k8s:')) {
    const [, apiVersion, kind] = type.split(':');
    if (kind === 'ObjectMeta') return walk(value, 'V1ObjectMeta', path);
    if (await modelCheck(apiVersion, kind, value, path)) {
      const version = apiVersion.split('/').pop();
      walk(value, `${pascal(version)}${kind}`, path);
    }
    return;
  }
  const [fields, required] = kJobSetTypes[type];
  if (typeof value !== 'object' || Array.isArray(value)) return report(path, `expected an object (${type})`);
  for (const r of required) if (!(r in value)) report(path, `missing required field ${r}`);
  for (const [k, v] of Object.entries(value)) {
    if (!(k in fields)) {
      const close = Object.keys(fields).filter((f) => editDistance(f.toLowerCase(), k.toLowerCase()) <= 2);
      report(`${path}.${k}`, `unknown field "${k}" in JobSet ${type}` +
        (close.length ? ` (did you mean ${close.map((c) => `"${c}"`).join(' or ')}?)` : ''));
      continue;
    }
    await jobSetWalk(v, fields[k], `${path}.${k}`);
  }
}

const dns1035 = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;

// The JobSet webhook's checks a manifest can fail (pkg/webhooks/jobset_webhook.go).
function jobSetRules(js, where) {
  const spec = js.spec ?? {};
  const rjobs = spec.replicatedJobs ?? [];
  const name = js.metadata?.name ?? '';
  const seen = new Set();
  rjobs.forEach((rj, i) => {
    const at = `${where}.spec.replicatedJobs[${i}]`;
    if (seen.has(rj.name)) report(at, `replicatedJob name ${rj.name} is used twice`);
    (rj.dependsOn ?? []).forEach((d) => {
      if (!seen.has(d.name)) report(`${at}.dependsOn`, `replicatedJob ${rj.name} cannot depend on ${d.name} (only on one listed before it)`);
    });
    if ((rj.dependsOn ?? []).length > 1) report(`${at}.dependsOn`, 'at most one item is supported');
    seen.add(rj.name);
    const replicas = rj.replicas ?? 1;
    const jobName = `${name}-${rj.name}-${replicas - 1}`;
    if (!dns1035.test(jobName) || jobName.length > 63) {
      report(`${at}.name`, `the Job name ${jobName} must be a DNS-1035 label of at most 63 characters`);
    }
    const t = rj.template?.spec ?? {};
    if (t.completionMode === 'Indexed' && Number.isInteger(t.completions)) {
      const pod = `${jobName}-${t.completions - 1}-abcde`;
      if (pod.length > 63) report(`${at}.name`, `the pod name ${pod} is longer than 63 characters`);
    }
  });
  if (spec.startupPolicy?.startupPolicyOrder === 'InOrder' && rjobs.some((rj) => rj.dependsOn)) {
    report(`${where}.spec`, 'startupPolicy InOrder and dependsOn are mutually exclusive');
  }
  const targets = [['successPolicy', spec.successPolicy?.targetReplicatedJobs]];
  (spec.failurePolicy?.rules ?? []).forEach((r, i) => targets.push([`failurePolicy.rules[${i}]`, r.targetReplicatedJobs]));
  for (const [field, names] of targets) {
    for (const n of names ?? []) if (!seen.has(n)) report(`${where}.spec.${field}`, `targetReplicatedJobs names ${n}, which is no replicatedJob`);
  }
  const sub = spec.network?.subdomain;
  if (sub !== undefined && (!dns1035.test(sub) || sub.length > 63)) {
    report(`${where}.spec.network.subdomain`, `${sub} must be a DNS-1035 label of at most 63 characters`);
  }
  if (spec.coordinator && !seen.has(spec.coordinator.replicatedJob)) {
    report(`${where}.spec.coordinator`, `replicatedJob ${spec.coordinator.replicatedJob} does not exist`);
  }
}

async function jobSetCheck(obj, where) {
  await jobSetWalk(obj, 'JobSet', where);
  jobSetRules(obj, where);
}

// --- 2b. Variable references --------------------------------------------------------

// Kubernetes expands $(VAR) in a container's env values (VAR defined earlier in env),
// args and command (VAR anywhere in env), and leaves a reference to anything else as it
// is: a misspelled name becomes a literal "$(PS_SHARD_IDX)" in a flag, silently. Every
// reference must name a variable the container defines ($$ escapes one).
function podSpecsOf(obj) {
  const specs = [];
  const add = (spec, at) => { if (spec?.containers) specs.push([spec, at]); };
  add(obj.spec?.template?.spec, 'spec.template.spec');
  (obj.spec?.replicatedJobs ?? []).forEach((rj, i) =>
    add(rj.template?.spec?.template?.spec, `spec.replicatedJobs[${i}].template.spec.template.spec`));
  add(obj.spec?.jobTemplate?.spec?.template?.spec, 'spec.jobTemplate.spec.template.spec');
  return specs;
}

function referenceCheck(obj, where) {
  for (const [spec, at] of podSpecsOf(obj)) {
    for (const [kind, list] of [['containers', spec.containers], ['initContainers', spec.initContainers ?? []]]) {
      list.forEach((c, ci) => {
        const here = `${where}.${at}.${kind}[${ci}]`;
        if (c.envFrom?.length) return;  // names from a ConfigMap or Secret: not known here
        const env = (c.env ?? []).map((e) => e.name);
        const refs = (text) => [...String(text).replaceAll('$$', '').matchAll(/\$\(([^)]*)\)/g)].map((m) => m[1]);
        (c.env ?? []).forEach((e, i) => {
          for (const r of refs(e.value ?? '')) {
            if (!env.slice(0, i).includes(r)) {
              report(`${here}.env[${i}]`, `${e.name} refers to $(${r}), ` +
                (env.includes(r) ? 'defined only after it (Kubernetes expands earlier variables only)' : 'which the container does not define'));
            }
          }
        });
        for (const field of ['args', 'command']) {
          (c[field] ?? []).forEach((a, i) => {
            for (const r of refs(a)) {
              if (!env.includes(r)) report(`${here}.${field}[${i}]`, `${a} refers to $(${r}), which the container does not define`);
            }
          });
        }
      });
    }
  }
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
  const jobSets = objects.filter((o) => o.kind === 'JobSet');
  if (jobSets.length) return jobSets.forEach((js) => jobSetConsistency(js, objects, source));
  const find = (kind) => objects.filter((o) => o.kind === kind);
  const sts = find('StatefulSet').find((o) => o.metadata?.name === 'ps-shard');
  if (!sts) return report(source, 'no StatefulSet ps-shard and no JobSet');
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
  const toml = shardToml(sts.spec.template.spec, objects, where);
  if (!toml) return;
  const replicas = sts.spec.replicas ?? 1;
  const numShards = Number(toml.get('num-shards') ?? 1);
  if (numShards !== replicas) report(where, `replicas ${replicas} != num-shards ${numShards} in ps-server.toml`);
  const port = Number(toml.get('port') ?? 7070);
  const expectedPeers = Array.from({ length: replicas }, (_, i) => `${sts.metadata.name}-${i}.${svcName}:${port}`);
  const peers = toml.get('peers') ?? [];
  if (replicas > 1 && peers.join(',') !== expectedPeers.join(',')) {
    report(where, `peers in ps-server.toml [${peers}] != [${expectedPeers}]`);
  }
  shardPodChecks(sts.spec.template.spec, toml, where, svc);
  // One model per run: the shards serve one run id, which every worker Job shares, and
  // each run checkpoints apart, so a new run id starts fresh instead of restoring.
  const sc = sts.spec.template.spec.containers[0];
  const shardRun = runSource(sc);
  if (!shardRun) report(where, 'PS_RUN_ID is not set: a worker Job of another run would silently continue this model');
  const checkpointDir = envOf(sc, 'PS_CHECKPOINT_DIR')?.value ?? argValue(sc.args, '--checkpoint-dir') ?? toml.get('checkpoint-dir');
  if (checkpointDir && !checkpointDir.includes('$(PS_RUN_ID)')) {
    report(where, `checkpoint directory ${checkpointDir} must contain $(PS_RUN_ID): a new run would restore the old run's checkpoint`);
  }
  // n: the shards' PS_WORKERS (copied from the worker Job's completions by the overlays'
  // component), else the TOML's workers; never both.
  const workersEnv = envOf(sc, 'PS_WORKERS')?.value;
  if (workersEnv !== undefined && toml.has('workers')) {
    report(where, 'the worker count is both PS_WORKERS and workers in ps-server.toml; keep one (PS_WORKERS, copied from the Job)');
  }
  const workers = Number(workersEnv ?? toml.get('workers') ?? 1);
  for (const job of find('Job')) {
    const jw = `${source}: Job ${job.metadata.name}`;
    const wc = job.spec.template.spec.containers[0];
    if (shardRun && runSource(wc) !== shardRun) {
      report(jw, `PS_RUN_ID ${runSource(wc) ?? 'unset'} != the shards' ${shardRun}`);
    }
    const runArg = argValue(wc.args, '--run-id');
    if (runArg !== undefined && runArg !== '$(PS_RUN_ID)') report(jw, `--run-id ${runArg} is not $(PS_RUN_ID)`);
    if (job.spec.completionMode !== 'Indexed') report(jw, 'completionMode must be Indexed');
    if (job.spec.completions !== workers) report(jw, `completions ${job.spec.completions} != the shards' workers ${workers}`);
    if (job.spec.parallelism !== job.spec.completions) {
      report(jw, 'parallelism must equal completions (a round needs all workers at once)');
    }
    const args = wc.args;
    const workersArg = argValue(args, '--workers');
    const resolved = workersArg === '$(PS_NUM_WORKERS)' ? envOf(wc, 'PS_NUM_WORKERS')?.value : workersArg;
    if (Number(resolved) !== workers) report(jw, `--workers ${workersArg} (${resolved}) != the shards' workers ${workers}`);
    const numWorkers = envOf(wc, 'PS_NUM_WORKERS')?.value;
    if (numWorkers !== undefined && Number(numWorkers) !== workers) {
      report(jw, `PS_NUM_WORKERS ${numWorkers} != the shards' workers ${workers}`);
    }
    if (argValue(args, '--shards') !== expectedPeers.join(',')) {
      report(jw, `--shards ${argValue(args, '--shards')} != ${expectedPeers.join(',')}`);
    }
  }
}

// The TOML of the ConfigMap mounted as volume "config" in a shard pod, or null.
function shardToml(podSpec, objects, where) {
  const cmName = podSpec.volumes?.find((v) => v.name === 'config')?.configMap?.name;
  const cm = objects.find((o) => o.kind === 'ConfigMap' && o.metadata?.name === cmName);
  if (!cm?.data?.['ps-server.toml']) {
    report(where, `config volume: no ConfigMap ${cmName} with ps-server.toml`);
    return null;
  }
  return parseFlatToml(cm.data['ps-server.toml']);
}

// What any shard pod needs, wherever it runs: probes on a plaintext port, the data port
// exposed, a grace period longer than the drain. svc: the Service that must carry the
// data port (a StatefulSet's); none for a JobSet, whose headless Service has no ports.
function shardPodChecks(podSpec, toml, where, svc) {
  const port = Number(toml.get('port') ?? 7070);
  const container = podSpec.containers[0];
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
  // data-plane = "tcp" (ps-server's default) it must be a fixed port (0 picks one no
  // manifest can name), and any data-port set must be a containerPort and a port of the
  // Service. With TLS the data port serves the same certificates as port 7070
  // (docs/data-plane.md, "TLS.").
  const plane = toml.get('data-plane') ?? 'tcp';
  const dataPort = Number(toml.get('data-port') ?? 0);
  if (plane === 'tcp' && dataPort === 0) {
    report(where, 'data-plane = "tcp" (the default) needs a fixed data-port (0 picks a free one, which no containerPort or Service port can name)');
  }
  if (dataPort > 0) {
    const exposed = (container.ports ?? []).find((p) => p.containerPort === dataPort);
    if (!exposed) {
      report(where, `data-port ${dataPort} in ps-server.toml: no containerPort ${dataPort} on container ${container.name}`);
    } else if (svc && !(svc.spec.ports ?? []).some((p) => p.port === dataPort &&
        [exposed.name, dataPort, undefined].includes(p.targetPort))) {
      report(`Service ${svc.metadata.name}`, `no port ${dataPort} for the data plane (data-port in ps-server.toml, targetPort ${exposed.name ?? dataPort})`);
    }
  }
  const drainMs = Number(toml.get('drain-timeout-ms') ?? 10000);
  const grace = podSpec.terminationGracePeriodSeconds ?? 30;
  if (grace * 1000 <= drainMs) {
    report(where, `terminationGracePeriodSeconds ${grace} must exceed drain-timeout-ms ${drainMs}`);
  }
}

// --- 3b. A run as a JobSet (deploy/k8s/run) -------------------------------------------

// The env entry NAME of a container: {value} or {valueFrom}, or undefined.
const envOf = (container, name) => (container.env ?? []).find((e) => e.name === name);
const labelRef = (e) => /^metadata\.labels\['([^']+)'\]$/.exec(e?.valueFrom?.fieldRef?.fieldPath ?? '')?.[1];
// Where a container's PS_RUN_ID comes from, as a comparable string (or undefined).
function runSource(container) {
  const e = envOf(container, 'PS_RUN_ID');
  const ref = e?.valueFrom?.configMapKeyRef;
  if (ref) return `ConfigMap ${ref.name} key ${ref.key}`;
  return e?.value !== undefined ? `"${e.value}"` : undefined;
}
const annotationRef = (e) => /^metadata\.annotations\['([^']+)'\]$/.exec(e?.valueFrom?.fieldRef?.fieldPath ?? '')?.[1];

function jobSetConsistency(js, objects, source) {
  const where = `${source}: JobSet ${js.metadata.name}`;
  const rjobs = new Map((js.spec.replicatedJobs ?? []).map((rj) => [rj.name, rj]));
  const shard = rjobs.get('shard');
  const worker = rjobs.get('worker');
  if (!shard || !worker) return report(where, 'needs the replicatedJobs "shard" and "worker"');
  const name = js.metadata.name;
  const subdomain = js.spec.network?.subdomain ?? name;
  if (js.spec.network?.enableDNSHostnames !== true) {
    report(`${where}.spec.network`, 'enableDNSHostnames must be true (workers and peers dial the shards by pod name)');
  }
  if (js.spec.network?.publishNotReadyAddresses === false) {
    report(`${where}.spec.network`, 'publishNotReadyAddresses must not be false (shards resolve peers before ready)');
  }
  // The shards run until stopped: the run must end when the workers do, which then
  // stops the shards. Any other success policy waits for shards that never complete.
  const sp = js.spec.successPolicy;
  if (sp?.operator !== 'All' || (sp.targetReplicatedJobs ?? []).join(',') !== 'worker') {
    report(`${where}.spec.successPolicy`, 'must be {operator: All, targetReplicatedJobs: [worker]}: the shards never complete on their own, so the run ends with its workers and that stops the shards');
  }
  for (const [rname, rj] of [['shard', shard], ['worker', worker]]) {
    const at = `${where}.spec.replicatedJobs[${rname}]`;
    const spec = rj.template.spec;
    if ((rj.replicas ?? 1) !== 1) report(at, `replicas must be 1 (one Indexed Job; its completions count the ${rname}s)`);
    if (spec.completionMode !== 'Indexed') report(at, 'completionMode must be Indexed (the completion index is the id)');
    if (spec.parallelism !== spec.completions) {
      report(at, `parallelism ${spec.parallelism} != completions ${spec.completions} (every ${rname} runs at once)`);
    }
  }
  const dep = worker.dependsOn ?? [];
  if (dep.length !== 1 || dep[0].name !== 'shard' || dep[0].status !== 'Ready') {
    report(`${where}.spec.replicatedJobs[worker].dependsOn`, 'should be [{name: shard, status: Ready}] (workers start once the shards agree)');
  }
  const shardPod = shard.template.spec.template.spec;
  const workerPod = worker.template.spec.template.spec;
  const sc = shardPod.containers[0];
  const wc = workerPod.containers[0];
  const shards = shard.template.spec.completions;
  const workers = worker.template.spec.completions;
  const toml = shardToml(shardPod, objects, `${where} shard`);
  if (!toml) return;
  for (const key of ['workers', 'num-shards', 'peers', 'run-id', 'shard-id']) {
    if (toml.has(key)) report(`${where} ps-server.toml`, `sets ${key}, which the JobSet gives every shard (its environment wins); remove it so it is written once`);
  }
  shardPodChecks(shardPod, toml, `${where} shard`, null);
  // Ids from the completion index; the run id from the JobSet's UID on both sides.
  if (annotationRef(envOf(sc, 'PS_SHARD_ID')) !== 'batch.kubernetes.io/job-completion-index') {
    report(`${where} shard`, 'PS_SHARD_ID must come from the completion index (metadata.annotations[\'batch.kubernetes.io/job-completion-index\'])');
  }
  if (annotationRef(envOf(wc, 'PS_WORKER_ID')) !== 'batch.kubernetes.io/job-completion-index') {
    report(`${where} worker`, 'PS_WORKER_ID must come from the completion index');
  }
  for (const [side, c] of [['shard', sc], ['worker', wc]]) {
    if (labelRef(envOf(c, 'PS_RUN_ID')) !== 'jobset.sigs.k8s.io/jobset-uid') {
      report(`${where} ${side}`, 'PS_RUN_ID must be the JobSet\'s UID (metadata.labels[\'jobset.sigs.k8s.io/jobset-uid\']): a new run is a new model');
    }
  }
  // Counts: one source each (completions), every copy equal to it.
  const n = (c, v) => Number(envOf(c, v)?.value);
  if (n(sc, 'PS_NUM_SHARDS') !== shards) report(`${where} shard`, `PS_NUM_SHARDS ${envOf(sc, 'PS_NUM_SHARDS')?.value} != completions ${shards}`);
  if (n(sc, 'PS_WORKERS') !== workers) report(`${where} shard`, `PS_WORKERS ${envOf(sc, 'PS_WORKERS')?.value} != the worker Job's completions ${workers}`);
  if (n(wc, 'PS_NUM_WORKERS') !== workers) report(`${where} worker`, `PS_NUM_WORKERS ${envOf(wc, 'PS_NUM_WORKERS')?.value} != completions ${workers}`);
  const wargs = wc.args ?? [];
  const workersArg = argValue(wargs, '--workers');
  if (workersArg !== undefined && workersArg !== '$(PS_NUM_WORKERS)' && Number(workersArg) !== workers) {
    report(`${where} worker`, `--workers ${workersArg} != completions ${workers}`);
  }
  // Peers: shard i is <name>-shard-0-i.<subdomain>, $(JOBSET_NAME) standing for the
  // name where JOBSET_NAME is the jobset-name label.
  const jsName = labelRef(envOf(sc, 'JOBSET_NAME')) === 'jobset.sigs.k8s.io/jobset-name' ? name : undefined;
  const port = Number(toml.get('port') ?? 7070);
  const peers = (envOf(sc, 'PS_PEERS')?.value ?? '').split(',').filter((p) => p);
  const resolved = peers.map((p) => (jsName ? p.replaceAll('$(JOBSET_NAME)', jsName) : p));
  const expected = Array.from({ length: shards }, (_, i) => `${name}-shard-0-${i}.${subdomain}:${port}`);
  if (resolved.join(',') !== expected.join(',')) {
    report(`${where} shard`, `PS_PEERS [${resolved}] != [${expected}] (completions ${shards}, one per shard in id order)`);
  }
  const shardsArg = envOf(wc, 'PS_SHARDS')?.value;
  if (shardsArg !== envOf(sc, 'PS_PEERS')?.value) {
    report(`${where} worker`, `PS_SHARDS ${shardsArg} != the shards' PS_PEERS`);
  } else if (jsName && labelRef(envOf(wc, 'JOBSET_NAME')) !== 'jobset.sigs.k8s.io/jobset-name') {
    report(`${where} worker`, 'PS_SHARDS uses $(JOBSET_NAME): define JOBSET_NAME from the jobset-name label before it');
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
    if (obj.apiVersion === 'jobset.x-k8s.io/v1alpha2' && obj.kind === 'JobSet') await jobSetCheck(obj, where);
    else if (await schemaCheck(obj, where)) strictCheck(obj, where);
    referenceCheck(obj, where);
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
