// Loaded first (node --import) in fluffy's test sandbox.
// 1. The folders tools cache into beside their packages (/node_modules/.vite, .cache ...)
//    are links into /tmp, the sandbox's own tmpfs: this makes them exist.
// 2. The sandbox has no network at all (Docker's NetworkDisabled), so /etc/hosts is empty
//    and `localhost` does not resolve; vite and vitest look it up to start.  Here it is
//    the loopback address, as every machine's hosts file says.
import dns from 'node:dns';
import { mkdirSync } from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';

for (const name of ['.vite', '.vite-temp', '.cache', '.vitest']) {
  try { mkdirSync(`/tmp/${name}`, { recursive: true }); } catch { /* read-only: a tool says so */ }
}

const LOOPBACK = [{ address: '127.0.0.1', family: 4 }, { address: '::1', family: 6 }];

function local(hostname, options) {
  if (typeof hostname !== 'string' || hostname.toLowerCase() !== 'localhost') return null;
  const opts = typeof options === 'number' ? { family: options } : (options || {});
  const found = LOOPBACK.filter((a) => !opts.family || a.family === opts.family);
  return opts.all ? found : found[0];
}

const lookup = dns.lookup;
dns.lookup = function fluffyLookup(hostname, options, callback) {
  const cb = typeof options === 'function' ? options : callback;
  const answer = local(hostname, typeof options === 'function' ? {} : options);
  if (answer === null || typeof cb !== 'function') return lookup.apply(this, arguments);
  process.nextTick(() => (Array.isArray(answer) ? cb(null, answer) : cb(null, answer.address, answer.family)));
  return undefined;
};

const promised = dns.promises.lookup;
dns.promises.lookup = async function fluffyLookup(hostname, options) {
  const answer = local(hostname, options);
  return answer === null ? promised.call(this, hostname, options) : answer;
};

// `import { lookup } from 'node:dns/promises'` sees the replacements too
syncBuiltinESMExports();
