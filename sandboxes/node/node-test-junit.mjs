// fluffy's JUnit reporter for node's test runner (node --test --test-reporter=<this>).
// One <testcase> per test: classname and file are the test file (relative to the
// working folder), the failure's type is the error's class (AssertionError, TypeError...)
// and its message the error's first line.  A test file that fails before its tests run
// (an import that fails) is one <testcase> with an <error> carrying what it printed.
import { relative } from 'node:path';
import { fileURLToPath } from 'node:url';

// Terminal escape sequences whole (colours, cursor moves, titles): removed before the
// control characters XML cannot hold, or the escape byte alone goes and `[31m` stays.
const SEQUENCES = /\u001b\[[0-?]{0,64}[ -/]{0,8}[@-~]|\u001b\][^\u0007\u001b\n]{0,512}(?:\u0007|\u001b\\)|\u001b[()*+][0-~]/g;
const plain = (text) => String(text).replace(SEQUENCES, '');
const esc = (text) => plain(text)
  .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/g, '')
  .replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

function rel(file) {
  if (!file) return '';
  const path = file.startsWith('file:') ? fileURLToPath(file) : file;
  return relative(process.cwd(), path);
}

function cause(error) {
  let found = error;
  while (found && found.code === 'ERR_TEST_FAILURE' && found.cause !== undefined) found = found.cause;
  return found;
}

export default async function* junit(source) {
  const cases = [];
  const printed = new Map();
  const stack = [];
  for await (const event of source) {
    const data = event.data || {};
    if (event.type === 'test:stderr' || event.type === 'test:stdout') {
      const key = rel(data.file);
      printed.set(key, ((printed.get(key) || '') + data.message).slice(-20000));
      continue;
    }
    if (event.type === 'test:start') { stack[data.nesting] = data.name; continue; }
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    if (data.details && data.details.type === 'suite') continue;
    const file = rel(data.file);
    const names = stack.slice(0, data.nesting).concat([data.name]);
    const item = { file, name: names.join(' > '), time: (data.details?.duration_ms || 0) / 1000 };
    if (data.skip !== undefined || data.todo !== undefined) item.skipped = true;
    if (event.type === 'test:fail') {
      const error = cause(data.details?.error);
      const own = data.name === data.file || rel(data.name) === file;  // the file itself failed
      if (own || typeof error === 'string' || error === undefined) {
        const said = plain(printed.get(file) || String(error || 'the test file failed'));
        item.kind = 'error';
        item.type = 'Error';
        const line = said.split('\n').find((l) => /^\w*(Error|Exception)\b/.test(l.trim()));
        item.message = (line || said.trim().split('\n').pop() || 'the test file failed').trim();
        const requirer = /Require stack:\s*\n-\s*(\S+)/.exec(said);
        if (requirer && /Cannot find module '[^']+'$/.test(item.message)) {
          item.message += ` from '${requirer[1]}'`;  // CommonJS says the requirer apart
        }
        item.text = said;
        item.name = file;
      } else {
        item.kind = 'failure';
        item.type = (error && (error.name || error.constructor?.name)) || 'Error';
        item.message = plain((error && error.message) || error).split('\n')[0];
        item.text = String((error && error.stack) || error);
      }
    }
    cases.push(item);
  }
  let out = '<?xml version="1.0" encoding="utf-8"?>\n<testsuites>\n';
  for (const c of cases) {
    out += `<testcase classname="${esc(c.file)}" name="${esc(c.name)}" file="${esc(c.file)}" time="${c.time}"`;
    if (c.skipped) out += '><skipped/></testcase>\n';
    else if (c.kind) {
      out += `><${c.kind} type="${esc(c.type)}" message="${esc(c.message)}">${esc(c.text)}</${c.kind}></testcase>\n`;
    } else out += '/>\n';
  }
  yield out + '</testsuites>\n';
}
