# SPDX-License-Identifier: AGPL-3.0-or-later
#
# Trims the PVE API viewer's schema (pve-docs `api-viewer/apidata.js`) to what parameter validation
# needs, as JSON: {"source": ..., "paths": {template: {METHOD: {"parameters": schema}}}}.
#
# Usage: python trim.py APIDATA.JS SOURCE-NOTE > pve-X.Y.json

import json
import sys

# The keys pve-common's PVE::JSONSchema (check_prop, check_object, parse_property_string) reads when
# it validates a request; descriptions, defaults and typetext only document.
KEEP = ('type', 'enum', 'pattern', 'minimum', 'maximum', 'minLength', 'maxLength', 'optional',
        'additionalProperties', 'requires', 'alias', 'keyAlias', 'default_key', 'instance-types',
        'type-property', 'minItems')


def trim(schema):
    if not isinstance(schema, dict):
        return schema
    out = {k: schema[k] for k in KEEP if k in schema}
    fmt = schema.get('format')
    if isinstance(fmt, dict):
        out['format'] = {key: trim(sub) for key, sub in fmt.items()}
    elif fmt is not None:
        out['format'] = fmt
    if isinstance(schema.get('properties'), dict):
        out['properties'] = {key: trim(sub) for key, sub in schema['properties'].items()}
    if isinstance(schema.get('items'), dict):
        out['items'] = trim(schema['items'])
    if isinstance(schema.get('oneOf'), list):
        out['oneOf'] = [trim(sub) for sub in schema['oneOf']]
    return out


def main(apidata, source):
    text = open(apidata, encoding='utf-8').read()
    tree = json.loads(text[text.index('['):text.rindex(']') + 1])
    paths = {}

    def walk(nodes):
        for node in nodes:
            paths[node['path']] = {method: {'parameters': trim(info.get('parameters') or {})}
                                   for method, info in sorted((node.get('info') or {}).items())}
            walk(node.get('children') or [])
    walk(tree)
    # One key a line, so a new release's schema reads as a diff.
    json.dump({'source': source, 'paths': paths}, sys.stdout, sort_keys=True, indent=0,
              separators=(',', ':'))
    sys.stdout.write('\n')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
