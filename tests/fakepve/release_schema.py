# SPDX-License-Identifier: AGPL-3.0-or-later
#
# The official API schema of the Proxmox VE release the launcher emulates (`pve_version`), and the
# parameter check pveproxy makes with it. fakepve checks every request against one PVE 9 schema;
# a real PVE 8 refuses what its own schema lacks (a parameter added in 9, `purge` on an HA resource
# delete), so the launcher checks each request against its release's schema first.
#
# What a real server does, from the sources:
# - pve-manager PVE/HTTPServer.pm `rest_handler`: a method the API has no handler for answers
#   501 "Method '<METHOD> <path>' not implemented"; otherwise the path parameters join the request
#   parameters and the handler runs.
# - pve-common src/PVE/RESTHandler.pm `handle`: `PVE::JSONSchema::validate($param, $schema)` before
#   the method's code.
# - pve-common src/PVE/JSONSchema.pm `validate`: every error found, by parameter, in one HTTP 400
#   "Parameter verification failed." (`check_prop`: type, format, pattern, lengths, range,
#   enumeration; `check_object`: missing non-optional properties, `requires`, unknown properties
#   when `additionalProperties` is 0, a property whose `instance-types` do not name the value of
#   its `type-property` being optional; `check_format`/`parse_property_string`: property strings,
#   whose unknown sub-keys and sub-key values are errors of the parameter, "invalid format - ...").
# fakepve's `schema.validate` implements those checks with PVE's wording; this module hands it the
# emulated release's schema.

import functools
import json
import os
import re

from fakepve import schema as pve_schema
from fakepve.model import PveError

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_DIR = os.path.join(HERE, '..', 'pve-api')
# Major release -> the vendored schema emulating it (see tests/pve-api/README.md).
RELEASES = {8: 'pve-8.4.json', 9: 'pve-9.1.json'}
PREFIXES = ('/api2/json', '/api2/extjs')


@functools.lru_cache(maxsize=None)
def for_version(version):
    """The schema of the release a `pve_version` ("8.4.1") belongs to."""
    major = int(re.findall(r'\d+', version)[0])
    name = RELEASES[min(max(major, min(RELEASES)), max(RELEASES))]
    with open(os.path.join(SCHEMA_DIR, name), encoding='utf-8') as f:
        return pve_schema.Schema(json.load(f)['paths'])


def api_segments(request):
    """The request's path below the API prefix as decoded segments (an encoded `/` stays inside
    its segment); None outside the API."""
    import urllib.parse
    raw = request.rel_url.raw_path
    for prefix in PREFIXES:
        if raw.startswith(prefix + '/'):
            return [urllib.parse.unquote(seg) for seg in raw[len(prefix):].split('/') if seg]
    return None


def match(schema, segments):
    """The schema's method table for the path, as pve-common src/PVE/RESTHandler.pm
    `map_path_to_methods` finds it: segment by segment, and a last parameter taking the rest of the
    path (storage content's `{volume}` is registered with `fragmentDelimiter => ''`)."""
    for joined in range(len(segments), 0, -1):
        head, tail = segments[:joined - 1], '/'.join(segments[joined - 1:])
        hole = '\x00'
        found = schema.match('/' + '/'.join(s.replace('/', hole) for s in head + [tail]))
        if found is not None and (joined == len(segments) or found.template.endswith('/content/{volume}')):
            found.params = {k: v.replace(hole, '/') for k, v in found.params.items()}
            return found
    return schema.match('/') if not segments else None


def for_instance_type(spec, values):
    """The parameter schema with every property that does not apply to the request's type made
    optional (JSONSchema.pm `check_prop`, `$optional_for_type`)."""
    props = (spec or {}).get('properties') or {}
    if not any('instance-types' in p for p in props.values()):
        return spec
    out = {}
    for name, prop in props.items():
        kind = values.get(prop.get('type-property') or '')
        if 'instance-types' in prop and kind is not None and str(kind) not in prop['instance-types']:
            prop = dict(prop, optional=1)
        elif 'instance-types' in prop and kind is None:
            prop = dict(prop, optional=1)
        out[name] = prop
    return dict(spec, properties=out)


def refusal(schema, method, segments, values):
    """The PveError the release answers a request with before its handler runs, or None."""
    found = match(schema, segments)
    info = found.methods.get(method) if found is not None else None
    if info is None:
        return PveError(501, "Method '{0} /{1}' not implemented".format(method, '/'.join(segments)))
    spec = info.get('parameters') or {}
    declared = spec.get('properties') or {}
    values = dict(values)
    values.update((k, v) for k, v in found.params.items() if k in declared)
    _, errors = pve_schema.validate(for_instance_type(spec, values), values)
    if errors:
        return PveError(400, 'Parameter verification failed.', errors)
    return None
