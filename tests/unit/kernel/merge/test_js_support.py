"""A JavaScript project's test-support code in a session's change is named for review."""

from __future__ import annotations

import pytest

from fluffy.kernel.merge.support import support_changes

pytestmark = pytest.mark.unit

FILES = {
    "vitest.config.ts": b"export default { test: { reporters: ['default'] } }\n",
    "jest.config.js": b"module.exports = {}\n",
    "babel.config.cjs": b"module.exports = {}\n",
    ".babelrc": b"{}\n",
    "package.json": b'{"jest": {"setupFiles": ["./x.js"]}}\n',
    "test/vitest.setup.ts": b"import 'x';\n",
    "test/global-teardown.js": b"export default () => {};\n",
    "src/__mocks__/fs.js": b"module.exports = {};\n",
    "src/index.js": b"process.on('exit', () => require('fs').writeFileSync(process.env.X, ''));\n",
    "src/report.ts": b"const out = process.env.FLUFFY_JUNIT;\n",
    # not support: the tests and code themselves
    "test/setup.test.ts": b"import { setup } from '../src/setup';\n",
    "src/slug.ts": b"export const slug = (s: string) => s.toLowerCase();\n",
    "test/slug.test.ts": b"import { slug } from '../src/slug';\n",
    "README.md": b"reporters junit\n",
}


def test_support_code_of_a_javascript_project_is_named() -> None:
    found = {c.path: c.why for c in support_changes(FILES, FILES.get)}
    assert set(found) == {
        "vitest.config.ts", "jest.config.js", "babel.config.cjs", ".babelrc", "package.json",
        "test/vitest.setup.ts", "test/global-teardown.js", "src/__mocks__/fs.js",
        "src/index.js", "src/report.ts",
    }  # fmt: skip
    assert "process.on('exit'" in found["src/index.js"]
    assert "FLUFFY_JUNIT" in found["src/report.ts"]
