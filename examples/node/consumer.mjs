// Your own consumer of gpumedic's incidents, in Node: the `nats` and `ajv` packages from npm
// (with `ajv-formats` for date-time and uuid), no gpumedic code.
//
// It logs in as the `observer` NATS user, whose account receives every gpumedic event and has a
// JetStream of its own. There it keeps a stream of the incident events and a durable consumer, so
// it picks up where it left off after a restart. The stream has the name of gpumedic's own
// (GPUMEDIC_INCIDENTS, from subjects.json): gpumedic publishes with a Nats-Expected-Stream header,
// which a stream of any other name refuses. Every message is validated, with Ajv's default
// (strict) options, against its schema from proto/schemas/ (which one, by subject, from
// proto/subjects.json); one that does not validate is reported and terminated (a producer's bug),
// never a crash. Each valid incident event is printed as one JSON line.
//
//   npm ci && NATS_URL=tls://127.0.0.1:4222 NATS_USER=observer NATS_PASSWORD=... \
//     NATS_CA=var/secrets/tls/ca.pem node consumer.mjs
//
// Settings (environment): NATS_URL, NATS_USER (observer), NATS_PASSWORD, NATS_CA (the CA file,
// for tls:// URLs), PROTO_DIR (../../proto from here), STREAM (GPUMEDIC_INCIDENTS), DURABLE (node-example),
// START: where a new durable begins: `new` (the default: events from now on), `all` (everything the
// stream holds: `gpumedic up` keeps it from the stack's start) or a time (2026-11-26T09:00:00Z). A
// durable that exists already goes on where it left off. Ctrl-C stops it within a second.

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { AckPolicy, DeliverPolicy, connect } from "nats";

const INCIDENTS = "gpumedic.v1.incident.>";
const env = process.env;
const here = path.dirname(fileURLToPath(import.meta.url));
const proto = env.PROTO_DIR ?? path.resolve(here, "../../proto");

// Subject prefix -> [event name, compiled validator], for the incident events.
function validators() {
  const ajv = new Ajv2020();
  addFormats(ajv);
  const out = new Map();
  for (const entry of JSON.parse(fs.readFileSync(path.join(proto, "subjects.json"))).subjects) {
    if (entry.filter.startsWith("gpumedic.v1.incident.")) {
      const schema = JSON.parse(fs.readFileSync(path.join(proto, entry.schema)));
      out.set(entry.filter.replace(/\.\*$/, ""), [entry.event, ajv.compile(schema)]);
    }
  }
  return out;
}

const known = validators();
const stream = env.STREAM ?? "GPUMEDIC_INCIDENTS";
const durable = env.DURABLE ?? "node-example";
const user = env.NATS_USER ?? "observer";
const nc = await connect({
  servers: env.NATS_URL ?? "nats://127.0.0.1:4222",
  user,
  pass: env.NATS_PASSWORD,
  tls: env.NATS_CA ? { caFile: env.NATS_CA } : undefined,
  inboxPrefix: `_INBOX.${user}`,
  name: durable,
});
const jsm = await nc.jetstreamManager();
try {
  await jsm.streams.info(stream);
} catch {
  await jsm.streams.add({ name: stream, subjects: [INCIDENTS], max_age: 7 * 24 * 3600 * 1e9 });
}
// START as a deliver policy; it applies to a new durable only.
function startPosition(start) {
  if (start === "" || start === "new") return { deliver_policy: DeliverPolicy.New };
  if (start === "all") return { deliver_policy: DeliverPolicy.All };
  const when = new Date(start);
  if (Number.isNaN(when.getTime())) {
    console.error(`START=${JSON.stringify(start)}: use new, all or an ISO 8601 time such as 2026-11-26T09:00:00Z`);
    process.exit(2);
  }
  return { deliver_policy: DeliverPolicy.StartTime, opt_start_time: when.toISOString() };
}
const start = env.START ?? "new";
try {
  await jsm.consumers.info(stream, durable);
} catch {
  await jsm.consumers.add(stream, {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    filter_subject: INCIDENTS,
    max_deliver: 5,
    ...startPosition(start),
  });
}
const consumer = await nc.jetstream().consumers.get(stream, durable);
console.log(JSON.stringify({ ready: true, stream, durable, start }));

const messages = await consumer.consume();
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => messages.stop());
}
for await (const msg of messages) {
  const [event, validate] = known.get(msg.subject.replace(/\.[^.]*$/, "")) ?? [];
  let payload;
  let why;
  try {
    payload = msg.json();
    if (!validate) why = "no schema for this subject";
    else if (!validate(payload)) why = JSON.stringify(validate.errors).slice(0, 300);
  } catch (err) {
    why = `not JSON: ${err.message}`;
  }
  if (why) {
    console.error(JSON.stringify({ invalid: msg.subject, why }));
    msg.term(); // a producer's bug: never redelivered, never a crash
    continue;
  }
  const { incident_id, kind, node_id, summary = "" } = payload;
  console.log(JSON.stringify({ event, incident_id, kind, node_id, summary }));
  msg.ack();
}
await nc.close(); // what was printed was acked; the rest waits in the durable for the next run
process.exit(0); // no timer of the client's may keep the process after Ctrl-C
