"use strict";(self.rspackChunkresearch_lab=self.rspackChunkresearch_lab||[]).push([[232],{475(e,r,t){var o=t(601),n=t.n(o),a=t(314),i=(t.n(a))()(n());i.push([e.id,`/* The Research Lab side panel (JupyterLab theme variables only). */
.rl-LivePanel {
  overflow-y: auto;
  padding: 8px 12px;
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
  font-size: var(--jp-ui-font-size1);
}

.rl-LivePanel-title {
  font-size: var(--jp-ui-font-size2);
  margin: 4px 0;
}

.rl-LivePanel-status {
  color: var(--jp-ui-font-color2);
  margin-bottom: 6px;
}

.rl-LivePanel-section h3 {
  font-size: var(--jp-ui-font-size1);
  text-transform: uppercase;
  color: var(--jp-ui-font-color2);
  margin: 10px 0 4px;
}

.rl-item {
  border: 1px solid var(--jp-border-color2);
  border-radius: 4px;
  padding: 4px 6px;
  margin-bottom: 4px;
  cursor: pointer;
}

.rl-item:hover {
  background: var(--jp-layout-color2);
}

.rl-item-head {
  display: flex;
  justify-content: space-between;
  gap: 6px;
}

.rl-item-name {
  font-weight: 600;
  overflow: hidden;
  text-overflow: ellipsis;
}

.rl-item-detail,
.rl-empty {
  color: var(--jp-ui-font-color2);
}

.rl-badge {
  border-radius: 8px;
  padding: 0 6px;
  color: white;
  background: var(--jp-layout-color4);
  white-space: nowrap;
}

.rl-state-up,
.rl-state-running,
.rl-state-live {
  background: var(--jp-success-color1);
}

.rl-state-finished,
.rl-state-stopped {
  background: var(--jp-info-color1);
}

.rl-state-dead,
.rl-state-failed,
.rl-state-down,
.rl-state-controller-down,
.rl-state-node-down,
.rl-state-not-answering {
  background: var(--jp-error-color1);
}

.rl-state-stale {
  background: var(--jp-warn-color1);
}

.rl-error {
  color: var(--jp-error-color1);
}
`,""]),t.d(r,{},{A:i})},314(e){e.exports=function(e){var r=[];return r.toString=function(){return this.map(function(r){var t="",o=void 0!==r[5];return r[4]&&(t+="@supports (".concat(r[4],") {")),r[2]&&(t+="@media ".concat(r[2]," {")),o&&(t+="@layer".concat(r[5].length>0?" ".concat(r[5]):""," {")),t+=e(r),o&&(t+="}"),r[2]&&(t+="}"),r[4]&&(t+="}"),t}).join("")},r.i=function(e,t,o,n,a){"string"==typeof e&&(e=[[null,e,void 0]]);var i={};if(o)for(var s=0;s<this.length;s++){var c=this[s][0];null!=c&&(i[c]=!0)}for(var l=0;l<e.length;l++){var p=[].concat(e[l]);o&&i[p[0]]||(void 0!==a&&(void 0===p[5]||(p[1]="@layer".concat(p[5].length>0?" ".concat(p[5]):""," {").concat(p[1],"}")),p[5]=a),t&&(p[2]&&(p[1]="@media ".concat(p[2]," {").concat(p[1],"}")),p[2]=t),n&&(p[4]?(p[1]="@supports (".concat(p[4],") {").concat(p[1],"}"),p[4]=n):p[4]="".concat(n)),r.push(p))}},r}},601(e){e.exports=function(e){return e[1]}},72(e){var r=[];function t(e){for(var t=-1,o=0;o<r.length;o++)if(r[o].identifier===e){t=o;break}return t}function o(e,o){for(var n={},a=[],i=0;i<e.length;i++){var s=e[i],c=o.base?s[0]+o.base:s[0],l=n[c]||0,p="".concat(c," ").concat(l);n[c]=l+1;var u=t(p),d={css:s[1],media:s[2],sourceMap:s[3],supports:s[4],layer:s[5]};if(-1!==u)r[u].references++,r[u].updater(d);else{var f=function(e,r){var t=r.domAPI(r);return t.update(e),function(r){r?(r.css!==e.css||r.media!==e.media||r.sourceMap!==e.sourceMap||r.supports!==e.supports||r.layer!==e.layer)&&t.update(e=r):t.remove()}}(d,o);o.byIndex=i,r.splice(i,0,{identifier:p,updater:f,references:1})}a.push(p)}return a}e.exports=function(e,n){var a=o(e=e||[],n=n||{});return function(e){e=e||[];for(var i=0;i<a.length;i++){var s=t(a[i]);r[s].references--}for(var c=o(e,n),l=0;l<a.length;l++){var p=t(a[l]);0===r[p].references&&(r[p].updater(),r.splice(p,1))}a=c}}},659(e){var r={};e.exports=function(e,t){var o=function(e){if(void 0===r[e]){var t=document.querySelector(e);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(e){t=null}r[e]=t}return r[e]}(e);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(t)}},540(e){e.exports=function(e){var r=document.createElement("style");return e.setAttributes(r,e.attributes),e.insert(r,e.options),r}},56(e,r,t){e.exports=function(e){var r=t.nc;r&&e.setAttribute("nonce",r)}},825(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var r=e.insertStyleElement(e);return{update:function(t){var o,n,a;o="",t.supports&&(o+="@supports (".concat(t.supports,") {")),t.media&&(o+="@media ".concat(t.media," {")),(n=void 0!==t.layer)&&(o+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),o+=t.css,n&&(o+="}"),t.media&&(o+="}"),t.supports&&(o+="}"),(a=t.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),e.styleTagTransform(o,r,e.options)},remove:function(){var e;null===(e=r).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,r){if(r.styleSheet)r.styleSheet.cssText=e;else{for(;r.firstChild;)r.removeChild(r.firstChild);r.appendChild(document.createTextNode(e))}}},579(e,r,t){var o=t(72),n=t.n(o),a=t(825),i=t.n(a),s=t(659),c=t.n(s),l=t(56),p=t.n(l),u=t(540),d=t.n(u),f=t(113),v=t.n(f),m=t(475),h={};h.styleTagTransform=v(),h.setAttributes=p(),h.insert=c().bind(null,"head"),h.domAPI=i(),h.insertStyleElement=d(),n()(m.A,h),m.A&&m.A.locals&&m.A.locals}}]);