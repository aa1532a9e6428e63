"""Checks an HTML report: elements close in order, every inline SVG parses as XML, nothing is fetched.

Usage: check_html.py REPORT.html — prints "ok: N svg" or fails with the first problem.
"""
import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Balance(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []
        self.fetches = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") or (name == "style" and value and "url(" in value):
                self.fetches.append((tag, name, value))
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if not self.stack:
            raise SystemExit(f"</{tag}> at {self.getpos()} closes nothing")
        open_tag, pos = self.stack.pop()
        if open_tag != tag:
            raise SystemExit(f"</{tag}> at {self.getpos()} closes <{open_tag}> opened at {pos}")


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    if not text.startswith("<!DOCTYPE html>"):
        raise SystemExit("no doctype")
    parser = Balance()
    parser.feed(text)
    parser.close()
    if parser.stack:
        raise SystemExit(f"unclosed: {parser.stack}")
    if parser.fetches:
        raise SystemExit(f"fetches: {parser.fetches}")
    svgs = re.findall(r"<svg\b.*?</svg>", text, re.S)
    for i, svg in enumerate(svgs):
        try:
            root = ET.fromstring(svg)
        except ET.ParseError as e:
            raise SystemExit(f"svg {i}: {e}")
        if not root.tag.endswith("svg") or len(list(root.iter())) < 20:
            raise SystemExit(f"svg {i}: not a chart")
    print(f"ok: {len(svgs)} svg")


main()
