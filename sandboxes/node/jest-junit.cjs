// fluffy's JUnit reporter for jest (--reporters=<this>; FLUFFY_JUNIT names the file).
// One <testcase> per test: classname and file are the test file (relative to the
// working folder), the failure's type is the error's class (a failed expect() is an
// AssertionError) and its message the error's first line.  A test file that fails
// before its tests run (an import that fails) is one <testcase> with an <error>.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

// Terminal escape sequences whole (colours, cursor moves, titles): removed before the
// control characters XML cannot hold, or the escape byte alone goes and `[31m` stays.
const SEQUENCES = /\u001b\[[0-?]{0,64}[ -/]{0,8}[@-~]|\u001b\][^\u0007\u001b\n]{0,512}(?:\u0007|\u001b\\)|\u001b[()*+][0-~]/g;
const plain = (text) => String(text || '').replace(SEQUENCES, '');
const esc = (text) => plain(text)
  .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/g, '')
  .replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

function kindOf(detail, text) {
  if (detail && detail.matcherResult) return 'AssertionError';
  if (detail && typeof detail === 'object' && detail.name) return String(detail.name);
  const found = /^\s*(\w*Error)\b/m.exec(plain(text));
  return found ? found[1] : 'Error';
}

function firstLine(text) {
  const lines = plain(text).split('\n').map((l) => l.trim()).filter(Boolean);
  return lines[0] || 'failed';
}

class FluffyJunit {
  // paths from the working folder (the project's top), whatever jest's rootDir is
  constructor() { this.root = process.cwd(); }

  onRunComplete(_contexts, results) {
    let out = '<?xml version="1.0" encoding="utf-8"?>\n<testsuites>\n';
    for (const suite of results.testResults) {
      const file = path.relative(this.root, suite.testFilePath);
      if (suite.testExecError || (suite.failureMessage && suite.testResults.length === 0)) {
        const text = plain(suite.failureMessage || (suite.testExecError || {}).stack || '');
        const line = text.split('\n').map((l) => l.trim())
          .find((l) => /(Cannot find module|Error\b|is not|SyntaxError)/.test(l)) || firstLine(text);
        out += `<testcase classname="${esc(file)}" name="${esc(file)}" file="${esc(file)}" time="0">`
          + `<error type="Error" message="${esc(line)}">${esc(text)}</error></testcase>\n`;
        continue;
      }
      for (const test of suite.testResults) {
        const name = [...test.ancestorTitles, test.title].join(' > ');
        const time = (test.duration || 0) / 1000;
        out += `<testcase classname="${esc(file)}" name="${esc(name)}" file="${esc(file)}" time="${time}"`;
        if (test.status === 'failed') {
          const text = plain((test.failureMessages || []).join('\n'));
          const detail = (test.failureDetails || [])[0];
          const message = detail && detail.message ? firstLine(detail.message) : firstLine(text);
          out += `><failure type="${esc(kindOf(detail, text))}" message="${esc(message)}">`
            + `${esc(text)}</failure></testcase>\n`;
        } else if (test.status === 'pending' || test.status === 'skipped' || test.status === 'todo') {
          out += '><skipped/></testcase>\n';
        } else {
          out += '/>\n';
        }
      }
    }
    fs.writeFileSync(process.env.FLUFFY_JUNIT || 'junit.xml', out + '</testsuites>\n');
  }
}

module.exports = FluffyJunit;
